// A Plan's pieces as JSON, for files other than plan.json that carry them (the tune
// candidate files of autotune/tune_split.h): a kernel's TMA tensor map, written as
// plan.json writes it and read with plan.json's checks.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/json_reader.h"
#include "runtime/plan.h"

namespace sf {

nlohmann::json tensor_map_to_json(const PlanTensorMap& m);
// Throws DiagError (through `rd`) naming the path of a bad field.
PlanTensorMap read_plan_tensor_map(const json_read::Reader& rd, const nlohmann::json& mj, const std::string& path);

}  // namespace sf
