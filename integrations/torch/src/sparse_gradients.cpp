// SPDX-License-Identifier: Apache-2.0
#include "sparse_gradients.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <regex>

#include "pushpull/error.h"
#include "pushpull/log.h"
#include "tensor_collectives.h"

namespace pushpull::torch::detail {
namespace {

// `t`'s elements as `rows` rows of `width` bytes (flat first: viewing as
// bytes needs a unit last stride, which a transposed row may lack).
at::Tensor as_bytes(const at::Tensor& t, int64_t rows, int64_t width) {
  return t.contiguous().reshape({-1}).view(at::kByte).reshape({rows, width});
}

// Whether the ranks' ops in a "submitted differently" error are sparse rows
// (a 2-D uint8 allgather) on some ranks and something else (a dense
// allreduce, 2bit/1bit codes: 1-D) on others, rather than, say, two shapes.
bool kinds_differ(const std::string& text) {
  static const std::regex entry(R"(rank \d+: (allgather uint8\(\d+, \d+\))?)");
  int sparse = 0, other = 0;
  for (std::sregex_iterator it(text.begin(), text.end(), entry), end; it != end; ++it)
    ++((*it)[1].matched ? sparse : other);
  return sparse > 0 && other > 0;
}

// Columns [from, from + width) of the byte rows `rows`, as `type`.
at::Tensor columns_as(const at::Tensor& rows, int64_t from, int64_t width, at::ScalarType type) {
  return rows.narrow(1, from, width).contiguous().reshape({-1}).view(type);
}

}  // namespace

std::string sparse_grad_problem(const at::Tensor& g, const at::Tensor& param) {
  if (!g.device().is_cpu()) return "is not on the CPU (the collectives reduce host memory)";
  const auto t = g.scalar_type();
  if (t != at::kFloat && t != at::kDouble && t != at::kHalf && t != at::kBFloat16)
    return "has a dtype the collectives do not reduce (use float32/64, float16 or bfloat16)";
  if (g.sizes() != param.sizes() || t != param.scalar_type())
    return "but the parameter is " + describe(param);
  if (g.sparse_dim() < 1 || g.dense_dim() + 1 > Shape::kMaxDims)
    return "has a sparse layout the allgathers cannot carry";
  return {};
}

SparseGather start_sparse_gather(collective::Communicator& comm, const std::string& name,
                                 const at::Tensor& grad, const std::vector<int>& members) {
  SparseGather s;
  s.sizes.assign(grad.sizes().begin(), grad.sizes().end());
  s.sparse_dim = grad.sparse_dim();
  s.dtype = grad.scalar_type();
  const int64_t nnz = grad._nnz();
  int64_t per_row = 1;  // values per nonzero
  for (size_t d = static_cast<size_t>(s.sparse_dim); d < s.sizes.size(); ++d)
    per_row *= s.sizes[d];
  s.rows = at::cat({as_bytes(grad._indices().t(), nnz, s.sparse_dim * 8),
                    as_bytes(grad._values(), nnz, per_row * grad.element_size())},
                   1);
  s.handle = comm.allgather_async(name, view_of(s.rows), members);
  return s;
}

at::Tensor finish_sparse_gather(collective::Communicator& comm, SparseGather& s, double scale,
                                std::exception_ptr& error) {
  Array gathered;
  try {
    gathered = comm.take_output(s.handle);
  } catch (...) {
    if (!error) error = std::current_exception();
    return {};
  }
  const int64_t total = gathered.shape().ndim() > 0 ? gathered.shape()[0] : 0;
  const int64_t width = s.rows.size(1);
  if (gathered.numel() != total * width) {  // the negotiation checked the widths: never
    if (!error)
      error =
          std::make_exception_ptr(Internal("DistributedOptimizer: a sparse "
                                           "allgather returned rows of another width"));
    return {};
  }
  at::Tensor rows = at::empty({total, width}, at::kByte);
  if (rows.numel() > 0) std::memcpy(rows.data_ptr(), gathered.data(), rows.nbytes());
  const int64_t index_bytes = s.sparse_dim * 8;
  std::vector<int64_t> value_sizes{total};
  value_sizes.insert(value_sizes.end(), s.sizes.begin() + s.sparse_dim, s.sizes.end());
  at::Tensor indices = columns_as(rows, 0, index_bytes, at::kLong).reshape({total, s.sparse_dim});
  at::Tensor values =
      columns_as(rows, index_bytes, width - index_bytes, s.dtype).reshape(value_sizes);
  if (scale != 1.0) values.mul_(scale);
  // Built without checks of its own (they would sort): coalesce() sums duplicates.
  return at::_sparse_coo_tensor_unsafe(indices.t(), values, s.sizes).coalesce();
}

double sparse_scale(const frontend::ReducerOptions& o, int members) {
  double scale = o.op == collective::Reduction::kAverage ? 1.0 / members : 1.0;
  if (o.average_aggregated_gradients && o.backward_passes_per_step > 1)
    scale /= o.backward_passes_per_step;
  return scale;
}

bool in_flight(const collective::Communicator& comm, const SparseGather& s) {
  return s.handle.valid() && !comm.poll(s.handle);
}

void wait_sparse_gather(collective::Communicator& comm, const SparseGather& s) {
  if (!s.handle.valid()) return;
  try {
    comm.wait(s.handle);
  } catch (const std::exception& e) {
    PP_WARN("DistributedOptimizer: a sparse gradient's allgather failed: {}", e.what());
  }
}

at::Tensor empty_sparse_like(const at::Tensor& param, int64_t sparse_dim) {
  return at::zeros_like(param).to_sparse(sparse_dim);
}

std::vector<int64_t> declared_sparse_dims(
    const std::vector<std::string>& reduced, const std::vector<std::string>& declared,
    const std::vector<std::pair<std::string, at::Tensor>>& named) {
  std::vector<int64_t> dims(reduced.size(), 0);
  for (const auto& name : declared) {
    if (std::none_of(named.begin(), named.end(), [&](const auto& n) { return n.first == name; })) {
      throw InvalidArgument("DistributedOptimizer: sparse_parameters names '" + name +
                            "', which is not in named_parameters; pass the names "
                            "named_parameters() gives (pushpull::torch::sparse_parameters(model))");
    }
    auto it = std::find(reduced.begin(), reduced.end(), name);
    if (it != reduced.end()) dims[static_cast<size_t>(it - reduced.begin())] = 1;
  }
  return dims;
}

std::exception_ptr explain_mismatch(std::exception_ptr error, const std::vector<Guess>& guessed,
                                    const frontend::GradientReducer& reducer) {
  try {
    std::rethrow_exception(error);
  } catch (const InvalidArgument& e) {
    const std::string text = e.what();
    for (size_t i = 0; i < guessed.size(); ++i) {
      if (guessed[i] == Guess::kNone ||
          text.find("tensor '" + reducer.op_name(i) + "' was submitted differently") ==
              std::string::npos ||
          !kinds_differ(text))
        continue;
      const char* mine = guessed[i] == Guess::kDenseZeros
                             ? "got no gradient for it and contributed dense zeros"
                             : "contributed a sparse gradient";
      return std::make_exception_ptr(InvalidArgument(
          "DistributedOptimizer: parameter '" + reducer.name(i) +
          "' has a sparse gradient on some ranks and no (or a dense) gradient on others (this "
          "rank " +
          mine +
          "): a rank without a gradient cannot tell that the parameter is sparse, since it is "
          "not declared in DistributedOptimizerOptions::sparse_parameters and no earlier step "
          "reduced it as sparse. Declare it (sparse_parameters = "
          "pushpull::torch::sparse_parameters(*model), or its name), pass sparse_as_dense, or "
          "give every rank a gradient for it in every step. (" +
          text + ")"));
    }
  } catch (...) {
  }
  return error;
}

}  // namespace pushpull::torch::detail
