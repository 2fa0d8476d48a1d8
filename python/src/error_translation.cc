#include "error_translation.h"

#include <string>

#include <epmoe/communicator.h>
#include <epmoe/error.h>

namespace nb = nanobind;

namespace epmoe::python {
namespace {

// The exception classes, made once by bind_errors and kept for the
// translator (the module holds them too, so they live as long as it).
PyObject* usage_error = nullptr;
PyObject* peer_error = nullptr;
PyObject* aborted_error = nullptr;

PyObject* new_exception(nb::module_& m, const char* name, PyObject* base, const char* doc) {
  const std::string qualified = std::string("epmoe.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base, nullptr);
  if (type == nullptr) throw nb::python_error();
  m.attr(name) = nb::borrow(type);
  return type;
}

}  // namespace

void bind_errors(nb::module_& m) {
  usage_error = new_exception(m, "UsageError", PyExc_RuntimeError,
                              "A call out of its documented order (finish before begin, a backward without its "
                              "forward, a handle used twice); the message names the call and the order.");
  peer_error = new_exception(m, "PeerError", PyExc_RuntimeError,
                             "A peer rank failed, timed out or sent something unexpected; the message names it.");
  aborted_error = new_exception(m, "AbortedError", peer_error,
                                "A wait ended because the group was aborted: the consequence of a failure on "
                                "another rank, whose text it carries.");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const ConfigError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const FileError& e) {  // a model= or hardware= file: a bad argument too
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const NumericError& e) {  // a NaN or infinity in an input array
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const UsageError& e) {
      PyErr_SetString(usage_error, e.what());
    } catch (const AbortedError& e) {
      PyErr_SetString(aborted_error, e.what());
    } catch (const PeerError& e) {
      PyErr_SetString(peer_error, e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const InternalError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
}

}  // namespace epmoe::python
