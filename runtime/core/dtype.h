// Element types of shardfuse tensors and the conversions between them.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace sf {

enum class DType : uint8_t { F32, F16, BF16, I32, I64, Bool };

inline constexpr DType kAllDTypes[] = {DType::F32, DType::F16, DType::BF16,
                                       DType::I32, DType::I64, DType::Bool};

std::string_view dtype_name(DType t);
std::optional<DType> parse_dtype(std::string_view name);
// Bytes one element takes in memory (bool is one byte, as in NumPy and PyTorch).
int dtype_size(DType t);
bool is_float(DType t);
bool is_integer(DType t);  // i32, i64 (not bool)

// Type promotion for binary ops between two tensors, as torch.result_type does:
// bool < integers < floats; f16 with bf16 goes to f32.
DType promote(DType a, DType b);

// IEEE half and bfloat16 from/to float, round-to-nearest-even, NaN and Inf kept
// (a NaN stays a quiet NaN; overflow goes to Inf as the hardware cvt.rn does).
uint16_t f32_to_f16_bits(float f);
float f16_bits_to_f32(uint16_t h);
uint16_t f32_to_bf16_bits(float f);
float bf16_bits_to_f32(uint16_t h);

// Rounds a double to the nearest value representable in `t` (what storing it in a
// tensor of that dtype keeps). Integers truncate toward zero like a C cast, and
// saturate at the type's range; NaN becomes 0 for integers; bool is (v != 0).
double round_to_dtype(double v, DType t);

// double -> int64 truncating toward zero and saturating (NaN -> 0). A plain cast of
// a double >= 2^63 is undefined behaviour; 9223372036854775807.0 *is* 2^63.
int64_t saturating_i64(double v);

// An int64 as a double rounded to odd (truncate, then set the lowest bit if anything
// was dropped). Rounding that double to f32, f16 or bf16 gives the correctly rounded
// conversion of the integer, because round-to-odd at 53 bits followed by rounding to
// q <= 51 bits equals one rounding to q bits; a plain conversion rounds twice.
double i64_to_double_round_odd(int64_t v);

}  // namespace sf
