// Errors, the two kinds (as gloo does it):
//  * epmoe::Error and its subclasses: recoverable, caused by the outside world
//    (a bad config key, a malformed file, a peer that timed out, a NaN in an
//    input). The message
//    names the key / file / peer and the rule that was broken.
//  * EPMOE_CHECK*: always-on checks of internal invariants. A failure is a bug
//    in epmoe, reported as InternalError with both operands printed.
// EPMOE_DCHECK* are the same checks compiled only into debug builds, for hot
// loops.
#pragma once

#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>

namespace epmoe {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A configuration key has a bad value or violates a rule with another key.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A file is missing, unreadable, malformed or of the wrong shape / dtype.
class FileError : public Error {
 public:
  using Error::Error;
};

// A peer rank failed, timed out or sent something unexpected.
class PeerError : public Error {
 public:
  using Error::Error;
};

// A tensor holds a NaN or an infinity where finite numbers are required: an
// input (the message names the tensor and the first bad index) or a value a
// step produced (the message names the layer, the phase and the row).
// core/finite_check.h raises it.
class NumericError : public Error {
 public:
  using Error::Error;
};

// A call out of its documented order (finish before begin, a backward
// without its forward, a dispatch handle used twice): a mistake of the
// caller, named with the call and the order it must follow.
class UsageError : public Error {
 public:
  using Error::Error;
};

// A broken internal invariant (a bug). Thrown by EPMOE_CHECK.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// The process exit codes of the epmoe tool, one mapping for every launcher
// (cli/main.cc on one process or threads, the mpi launcher's MPI_Abort):
// 0 success, 2 an epmoe::Error (bad input, a failed peer), 1 anything else
// (an internal error, out of memory).
constexpr int kExitBadInput = 2;
constexpr int kExitInternalError = 1;
int exit_code_for(const std::exception_ptr& error);

namespace detail {

[[noreturn]] void throw_check_failure(const char* file, int line, const std::string& what);

template <typename A, typename B>
[[noreturn]] void throw_check_op_failure(const char* file, int line, const char* expr_a, const char* op,
                                         const char* expr_b, const A& a, const B& b) {
  std::ostringstream msg;
  msg << "check failed: " << expr_a << " " << op << " " << expr_b << " (" << a << " vs " << b << ")";
  throw_check_failure(file, line, msg.str());
}

}  // namespace detail
}  // namespace epmoe

#define EPMOE_CHECK(cond)                                                                          \
  do {                                                                                             \
    if (!(cond)) ::epmoe::detail::throw_check_failure(__FILE__, __LINE__, "check failed: " #cond); \
  } while (0)

#define EPMOE_CHECK_OP_(a, op, b)                                                                               \
  do {                                                                                                          \
    const auto& epmoe_check_a_ = (a);                                                                           \
    const auto& epmoe_check_b_ = (b);                                                                           \
    if (!(epmoe_check_a_ op epmoe_check_b_))                                                                    \
      ::epmoe::detail::throw_check_op_failure(__FILE__, __LINE__, #a, #op, #b, epmoe_check_a_, epmoe_check_b_); \
  } while (0)

#define EPMOE_CHECK_EQ(a, b) EPMOE_CHECK_OP_(a, ==, b)
#define EPMOE_CHECK_NE(a, b) EPMOE_CHECK_OP_(a, !=, b)
#define EPMOE_CHECK_LT(a, b) EPMOE_CHECK_OP_(a, <, b)
#define EPMOE_CHECK_LE(a, b) EPMOE_CHECK_OP_(a, <=, b)
#define EPMOE_CHECK_GT(a, b) EPMOE_CHECK_OP_(a, >, b)
#define EPMOE_CHECK_GE(a, b) EPMOE_CHECK_OP_(a, >=, b)

#ifdef NDEBUG
#define EPMOE_DCHECK(cond) \
  do {                     \
  } while (0)
#define EPMOE_DCHECK_LT(a, b) \
  do {                        \
  } while (0)
#else
#define EPMOE_DCHECK(cond) EPMOE_CHECK(cond)
#define EPMOE_DCHECK_LT(a, b) EPMOE_CHECK_LT(a, b)
#endif
