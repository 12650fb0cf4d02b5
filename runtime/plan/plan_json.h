// A Plan's pieces as JSON, for files other than plan.json that carry them (the tune
// candidate files of autotune/tune_split.h): a kernel's TMA tensor map, written as
// plan.json writes it and read with plan.json's checks; a library GEMM's call (a gemm
// step's fields: library, dtype, sizes, strides, transposes, epilogue, tf32).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/io/json_reader.h"
#include "runtime/plan/plan.h"

namespace sf {

nlohmann::json tensor_map_to_json(const PlanTensorMap& m);
// Throws DiagError (through `rd`) naming the path of a bad field.
PlanTensorMap read_plan_tensor_map(const json_read::Reader& rd, const nlohmann::json& mj, const std::string& path);
nlohmann::json gemm_desc_to_json(const GemmDesc& d);
// Every field required, numbers in range, library, dtype and epilogue known; whether
// the call fits its buffers is gemm_check's.
GemmDesc read_plan_gemm_desc(const json_read::Reader& rd, const nlohmann::json& j, const std::string& path);

}  // namespace sf
