// Errors, the two kinds (as gloo does it): the exception classes are public
// (<epmoe/error.h>); this internal header adds the checks and the exit codes.
//  * epmoe::Error and its subclasses: recoverable, caused by the outside world.
//  * EPMOE_CHECK*: always-on checks of internal invariants. A failure is a bug
//    in epmoe, reported as InternalError with both operands printed, then the
//    optional message: EPMOE_CHECK_EQ(rows, expected, "rows of chunk ", c)
//    streams its extra arguments into the text, like GLOO_ENFORCE_EQ(a, b,
//    "why"); they are evaluated only when the check fails.
// EPMOE_DCHECK* are the same checks for hot loops, compiled only where
// kDebugChecks is true: debug builds (no NDEBUG) and, by construction,
// sanitizer builds whatever their NDEBUG (as Highway turns HWY_DASSERT on
// under HWY_IS_ASAN / HWY_IS_TSAN), since scripts/test_sanitizers.sh builds
// RelWithDebInfo. Elsewhere their operands are type-checked, never evaluated.
#pragma once

#include <epmoe/error.h>

#include <exception>
#include <sstream>
#include <string>

// Sanitizer detection: gcc defines __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__;
// clang answers __has_feature (tested in a nested #if, which gcc < 14, having
// no __has_feature, never evaluates).
#if !defined(NDEBUG)
#define EPMOE_DEBUG_CHECKS 1
#elif defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EPMOE_DEBUG_CHECKS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define EPMOE_DEBUG_CHECKS 1
#endif
#endif
#ifndef EPMOE_DEBUG_CHECKS
#define EPMOE_DEBUG_CHECKS 0
#endif

namespace epmoe {

// True where EPMOE_DCHECK* are checked (see above). Not inline: each
// translation unit has its own, as with assert and NDEBUG.
constexpr bool kDebugChecks = EPMOE_DEBUG_CHECKS != 0;

// The process exit codes of the epmoe tool, one mapping for every launcher
// (cli/main.cc on one process or threads, the mpi launcher's MPI_Abort):
// 0 success, 2 an epmoe::Error (bad input, a failed peer), 1 anything else
// (an internal error, out of memory).
constexpr int kExitBadInput = 2;
constexpr int kExitInternalError = 1;
int exit_code_for(const std::exception_ptr& error);

namespace detail {

[[noreturn]] void throw_check_failure(const char* file, int line, const std::string& what);

// "<head>" without pieces, "<head>: <pieces...>" with them.
template <typename... Pieces>
std::string check_message(const std::string& head, const Pieces&... pieces) {
  if constexpr (sizeof...(pieces) == 0) {
    return head;
  } else {
    std::ostringstream msg;
    msg << head << ": ";
    (msg << ... << pieces);
    return msg.str();
  }
}

template <typename A, typename B, typename... Pieces>
[[noreturn]] void throw_check_op_failure(const char* file, int line, const char* expr_a, const char* op,
                                         const char* expr_b, const A& a, const B& b, const Pieces&... pieces) {
  std::ostringstream operands;
  operands << "check failed: " << expr_a << " " << op << " " << expr_b << " (" << a << " vs " << b << ")";
  throw_check_failure(file, line, check_message(operands.str(), pieces...));
}

}  // namespace detail
}  // namespace epmoe

#define EPMOE_CHECK(cond, ...)                                                                                    \
  do {                                                                                                            \
    if (!(cond))                                                                                                  \
      ::epmoe::detail::throw_check_failure(                                                                       \
          __FILE__, __LINE__, ::epmoe::detail::check_message("check failed: " #cond __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

#define EPMOE_CHECK_OP_(a, op, b, ...)                                                         \
  do {                                                                                         \
    const auto& epmoe_check_a_ = (a);                                                          \
    const auto& epmoe_check_b_ = (b);                                                          \
    if (!(epmoe_check_a_ op epmoe_check_b_))                                                   \
      ::epmoe::detail::throw_check_op_failure(__FILE__, __LINE__, #a, #op, #b, epmoe_check_a_, \
                                              epmoe_check_b_ __VA_OPT__(, ) __VA_ARGS__);      \
  } while (0)

#define EPMOE_CHECK_EQ(a, b, ...) EPMOE_CHECK_OP_(a, ==, b __VA_OPT__(, ) __VA_ARGS__)
#define EPMOE_CHECK_NE(a, b, ...) EPMOE_CHECK_OP_(a, !=, b __VA_OPT__(, ) __VA_ARGS__)
#define EPMOE_CHECK_LT(a, b, ...) EPMOE_CHECK_OP_(a, <, b __VA_OPT__(, ) __VA_ARGS__)
#define EPMOE_CHECK_LE(a, b, ...) EPMOE_CHECK_OP_(a, <=, b __VA_OPT__(, ) __VA_ARGS__)
#define EPMOE_CHECK_GT(a, b, ...) EPMOE_CHECK_OP_(a, >, b __VA_OPT__(, ) __VA_ARGS__)
#define EPMOE_CHECK_GE(a, b, ...) EPMOE_CHECK_OP_(a, >=, b __VA_OPT__(, ) __VA_ARGS__)

// `if constexpr` rather than #if: the operands stay compiled (no check rots
// in the builds that skip it) but are never evaluated there.
#define EPMOE_DCHECK(cond, ...)                                                        \
  do {                                                                                 \
    if constexpr (::epmoe::kDebugChecks) EPMOE_CHECK(cond __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)
#define EPMOE_DCHECK_OP_(check, a, b, ...)                                       \
  do {                                                                           \
    if constexpr (::epmoe::kDebugChecks) check(a, b __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)
#define EPMOE_DCHECK_EQ(a, b, ...) EPMOE_DCHECK_OP_(EPMOE_CHECK_EQ, a, b __VA_OPT__(, ) __VA_ARGS__)
#define EPMOE_DCHECK_NE(a, b, ...) EPMOE_DCHECK_OP_(EPMOE_CHECK_NE, a, b __VA_OPT__(, ) __VA_ARGS__)
#define EPMOE_DCHECK_LT(a, b, ...) EPMOE_DCHECK_OP_(EPMOE_CHECK_LT, a, b __VA_OPT__(, ) __VA_ARGS__)
#define EPMOE_DCHECK_LE(a, b, ...) EPMOE_DCHECK_OP_(EPMOE_CHECK_LE, a, b __VA_OPT__(, ) __VA_ARGS__)
#define EPMOE_DCHECK_GT(a, b, ...) EPMOE_DCHECK_OP_(EPMOE_CHECK_GT, a, b __VA_OPT__(, ) __VA_ARGS__)
#define EPMOE_DCHECK_GE(a, b, ...) EPMOE_DCHECK_OP_(EPMOE_CHECK_GE, a, b __VA_OPT__(, ) __VA_ARGS__)
