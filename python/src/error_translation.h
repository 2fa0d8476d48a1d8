// epmoe's C++ exceptions (<epmoe/error.h>) as Python exceptions, for every
// function of the _epmoe module:
//   ConfigError, FileError, NumericError  -> ValueError (a bad argument)
//   UsageError                            -> epmoe.UsageError (RuntimeError): a call out of its order
//   AbortedError                          -> epmoe.AbortedError (a PeerError): a consequence of a
//                                            failure elsewhere, never the root cause
//   PeerError                             -> epmoe.PeerError (RuntimeError): a peer failed or timed out
//   other epmoe::Error, InternalError     -> RuntimeError
// An argument that is not an array epmoe can read in place is a TypeError
// raised by array_views.h before any call.
#pragma once

#include <nanobind/nanobind.h>

namespace epmoe::python {

void bind_errors(nanobind::module_& m);

}  // namespace epmoe::python
