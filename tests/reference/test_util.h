// Helpers shared by the reference tests: tensors from literal values, one-op graphs,
// and checks that report which element differs.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "codegen/ir/builder.h"
#include "codegen/reference/evaluate.h"

namespace sf::test {

inline Tensor tensor(DType t, Shape s, const std::vector<double>& v) {
  Tensor x(t, std::move(s));
  EXPECT_EQ(x.numel(), static_cast<int64_t>(v.size()));
  for (size_t i = 0; i < v.size() && static_cast<int64_t>(i) < x.numel(); ++i)
    x.set(static_cast<int64_t>(i), v[i]);
  return x;
}

inline Tensor itensor(DType t, Shape s, const std::vector<int64_t>& v) {
  Tensor x(t, std::move(s));
  EXPECT_EQ(x.numel(), static_cast<int64_t>(v.size()));
  for (size_t i = 0; i < v.size() && static_cast<int64_t>(i) < x.numel(); ++i)
    x.set_int(static_cast<int64_t>(i), v[i]);
  return x;
}

inline std::vector<double> values(const Tensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.get(i));
  return v;
}

inline std::vector<int64_t> ivalues(const Tensor& t) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.get_int(i));
  return v;
}

inline Graph finish(GraphBuilder& b) {
  Result<Graph> r = b.finish();
  if (!r) {
    ADD_FAILURE() << r.error().str();
    return Graph{};
  }
  return std::move(r).value();
}

// Evaluates and expects success; returns the outputs.
inline std::vector<Tensor> run(const Graph& g, const std::vector<Tensor>& in) {
  Result<std::vector<Tensor>> r = evaluate(g, in);
  if (!r) {
    ADD_FAILURE() << r.error().str();
    return {};
  }
  return std::move(r).value();
}

// Evaluates and expects a Diag; returns its text.
inline std::string run_error(const Graph& g, const std::vector<Tensor>& in) {
  Result<std::vector<Tensor>> r = evaluate(g, in);
  if (r) {
    ADD_FAILURE() << "expected an error";
    return "";
  }
  return r.error().str();
}

// |got - want| <= tol * max(1, |want|), elementwise; NaN matches only NaN, and an
// infinity only the same infinity.
inline void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                         double tol = 1e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "element " << i << ": got " << got[i] << ", want NaN";
    } else if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << "element " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << "element " << i;
    }
  }
}

}  // namespace sf::test
