// SPDX-License-Identifier: Apache-2.0
// pushpull.Error and its subclasses, and the translation of the C++
// exceptions (include/pushpull/error.h) into them with the same messages.
//
// The classes also derive from the nearest built-in exception, so code that
// catches ValueError, LookupError, TimeoutError or OSError keeps working:
//   Error(RuntimeError)
//     InvalidArgument(Error, ValueError)    NotFound(Error, LookupError)
//     AlreadyExists(Error)                  Timeout(Error, TimeoutError)
//     PeerFailure(Error)                    ProtocolError(Error)
//     IoError(Error, OSError)               Internal(Error)
#include <Python.h>

#include <exception>
#include <string>

#include "bindings.h"
#include "pushpull/error.h"

namespace pushpull::python {
namespace {

struct ErrorClass {
  const char* name;
  PyObject* builtin;  // second base, or nullptr
  const char* doc;
};

// The classes live as attributes of the extension module; the translator
// looks them up there (a translator is a plain function: no captures).
// The Python class of a C++ error: named as ErrorCode (error_code_name),
// "Error" for a code without its own class.
std::string class_name(ErrorCode code) {
  return code == ErrorCode::kOk ? "Error" : std::string(error_code_name(code));
}

void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const Error& e) {
    py::object module = py::module_::import("pushpull._pushpull");
    py::object cls = module.attr(class_name(e.code()).c_str());
    PyErr_SetString(cls.ptr(), e.what());
  }
}

}  // namespace

void bind_errors(py::module_& m) {
  const ErrorClass classes[] = {
      {"InvalidArgument", PyExc_ValueError,
       "The caller passed something wrong (bad array, shape, dtype, option); nothing was "
       "changed."},
      {"NotFound", PyExc_LookupError,
       "A key, file or peer that does not exist (e.g. a key never initialised)."},
      {"AlreadyExists", nullptr, "E.g. a key initialised twice."},
      {"Timeout", PyExc_TimeoutError, "A deadline passed."},
      {"PeerFailure", nullptr, "Another node of the job died or was declared dead."},
      {"ProtocolError", nullptr, "Malformed or incompatible input from the network."},
      {"IoError", PyExc_OSError, "The operating system refused (socket, file)."},
      {"Internal", nullptr, "A bug in pushpull; please report it."},
  };
  PyObject* base = PyErr_NewExceptionWithDoc(
      "pushpull.Error", "Base of every exception pushpull raises.", PyExc_RuntimeError, nullptr);
  if (base == nullptr) throw py::error_already_set();
  m.attr("Error") = py::reinterpret_steal<py::object>(base);
  for (const ErrorClass& c : classes) {
    py::tuple bases = c.builtin ? py::make_tuple(py::handle(base), py::handle(c.builtin))
                                : py::make_tuple(py::handle(base));
    std::string qualified = std::string("pushpull.") + c.name;
    PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), c.doc, bases.ptr(), nullptr);
    if (cls == nullptr) throw py::error_already_set();
    m.attr(c.name) = py::reinterpret_steal<py::object>(cls);
  }
  py::register_exception_translator(&translate);
}

}  // namespace pushpull::python
