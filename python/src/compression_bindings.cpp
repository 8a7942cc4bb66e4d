// SPDX-License-Identifier: Apache-2.0
// bind_compression: pushpull::GradientCompressor (include/pushpull/compression.h)
// as `_pushpull.GradientCompressor`, for pushpull.torch's 1bit/2bit
// compression of the DistributedOptimizer (python/pushpull/torch/compression.py):
// encode a gradient with its residual, sum every rank's allgathered codes.
//
// Why: the codecs are the C++ kernels (vectorised, fused with the residual
// update) the stores use, so the Python optimizer sends the same bits a
// dist_sync_allreduce store would. Arrays in and out are numpy (the caller
// converts torch tensors without a copy); encode and sum release the GIL.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <map>
#include <span>
#include <string>

#include "bindings.h"
#include "pushpull/compression.h"

namespace pushpull::python {

void bind_compression(py::module_& m) {
  using Floats = py::array_t<float, py::array::c_style | py::array::forcecast>;
  using Bytes = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;
  py::class_<GradientCompressor>(m, "GradientCompressor")
      .def(py::init<const std::map<std::string, std::string>&>(), py::arg("params"))
      .def_property_readonly("gathers", &GradientCompressor::gathers)
      .def("describe", &GradientCompressor::describe)
      .def("encoded_bytes", &GradientCompressor::encoded_bytes, py::arg("n"))
      .def(
          "encode",
          [](GradientCompressor& c, uint64_t id, const Floats& grad) {
            const auto n = static_cast<size_t>(grad.size());
            Bytes out(static_cast<py::ssize_t>(c.encoded_bytes(n)));
            const float* in = grad.data();
            auto* dst = reinterpret_cast<std::byte*>(out.mutable_data());
            {
              py::gil_scoped_release nogil;
              c.encode(id, in, n, dst);
            }
            return out;
          },
          py::arg("id"), py::arg("grad"),
          "The wire form of grad (float32, flattened) plus the residual of id; uint8.")
      .def(
          "sum_gathered",
          [](const GradientCompressor& c, const Bytes& gathered, int ranks, size_t n) {
            Floats out(static_cast<py::ssize_t>(n));
            const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(gathered.data()),
                                                static_cast<size_t>(gathered.size()));
            float* dst = out.mutable_data();
            {
              py::gil_scoped_release nogil;
              c.sum_gathered(in, ranks, n, dst);
            }
            return out;
          },
          py::arg("gathered"), py::arg("ranks"), py::arg("n"),
          "The rank-order sum of `ranks` wire forms of n values (an allgather's output).")
      .def(
          "residual", [](const GradientCompressor& c, uint64_t id) { return c.residual(id); },
          py::arg("id"));
}

}  // namespace pushpull::python
