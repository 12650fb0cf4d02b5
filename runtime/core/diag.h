// Located errors and the Result type every user-facing boundary returns.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace sf {

struct SourceLoc {
  int line = 0;  // 1-based; 0 means "no location"
  int col = 0;
};

// An error meant for the user: `file:line:col: error: message`.
struct Diag {
  std::string file;
  SourceLoc loc;
  std::string message;
  // Set when the error only reports that another rank failed first (this rank saw
  // its abort: Gloo's "aborted: why", NCCL's ncclRemoteError). A runner of several
  // ranks reports a Diag without it ahead of one with it, so the user reads the
  // root cause (the rank that timed out), not an echo of it.
  bool from_peer = false;
  // Set when the error is a bug of shardfuse, not of the input (a broken invariant
  // that --verify-each or an internal check caught): the CLI reports it as an
  // internal error with exit status 3.
  bool internal = false;

  std::string str() const;
};

// `d` with `context` put before its message ("rank 0, step 3: "); the rest,
// from_peer included, is kept.
inline Diag with_context(const std::string& context, Diag d) {
  d.message = context + d.message;
  return d;
}

// A value or the Diag that says why there is none.
template <class T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit on purpose
  Result(Diag d) : v_(std::move(d)) {}       // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const Diag& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Diag> v_;
};

// Success, or the Diag that says why not: what a function with no value to return
// returns (the one error shape, with Result<T>; not std::optional<Diag>, whose empty
// state means success and reads backwards at the call site).
template <>
class Result<void> {
 public:
  Result() = default;                            // success
  Result(Diag d) : d_(std::move(d)), ok_(false) {}  // NOLINT: implicit on purpose
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Diag& error() const { return d_; }

 private:
  Diag d_;
  bool ok_ = true;
};

// Returns the Diag of `expr` (a Result<T> or Result<void>) from the enclosing
// function, which returns a Result, when it failed.
#define SF_TRY(expr)                                        \
  do {                                                      \
    auto&& sf_try_result_ = (expr);                         \
    if (!sf_try_result_.ok()) return sf_try_result_.error(); \
  } while (0)

// Thrown only inside a component and turned into a Diag at its boundary (the
// parser, the builder); never escapes a function that returns Result.
struct DiagError {
  Diag diag;
};

}  // namespace sf
