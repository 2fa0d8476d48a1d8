// The exceptions epmoe throws at its C++ API, in two kinds (as gloo does it):
//  * epmoe::Error and its subclasses: recoverable, caused by the outside world
//    (a bad config key, a malformed file, a peer that timed out, a NaN in an
//    input). The message names the key / file / peer and the rule that was
//    broken.
//  * InternalError: a broken internal invariant, a bug in epmoe (thrown by the
//    EPMOE_CHECK* macros of the internal header core/error.h, with both
//    operands printed).
// Public and std-only: a user catches these without epmoe's internal headers.
#pragma once

#include <stdexcept>
#include <string>

namespace epmoe {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;

  // Puts `context` ("step 7: ") in front of the message and keeps the
  // exception's type, so that a caller can say where an error happened:
  //   catch (epmoe::Error& e) { e.add_context("step 7: "); throw; }
  void add_context(const std::string& context) { std::runtime_error::operator=(std::runtime_error(context + what())); }
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

// A broken internal invariant (a bug), not the caller's doing: not an Error.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace epmoe
