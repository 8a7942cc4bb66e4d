// SPDX-License-Identifier: Apache-2.0
// pushpull::torch::elastic (pushpull/torch/elastic.h).
#include "pushpull/torch/elastic.h"

#include <torch/torch.h>

#include <cstring>

namespace pushpull::torch::elastic {
namespace {

collective::Communicator& default_comm() {
  return collective::default_session().communicator();
}

// The optimizer's state and each group's options (what load() alone does not
// restore), in libtorch's archive.
std::string save_optimizer(::torch::optim::Optimizer& opt) {
  ::torch::serialize::OutputArchive archive, state;
  opt.save(state);
  archive.write("state", state);
  const auto& groups = opt.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    ::torch::serialize::OutputArchive options;
    groups[g].options().serialize(options);
    archive.write("options/" + std::to_string(g), options);
  }
  std::string bytes;
  archive.save_to([&](const void* data, size_t n) {
    bytes.append(static_cast<const char*>(data), n);
    return n;
  });
  return bytes;
}

void load_optimizer(::torch::optim::Optimizer& opt, const std::string& bytes) {
  ::torch::serialize::InputArchive archive, state;
  archive.load_from(bytes.data(), bytes.size());
  archive.read("state", state);
  opt.state().clear();
  opt.load(state);
  auto& groups = opt.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    ::torch::serialize::InputArchive in;
    archive.read("options/" + std::to_string(g), in);
    auto options = groups[g].options().clone();
    options->serialize(in);
    groups[g].set_options(std::move(options));
  }
}

}  // namespace

ElasticDistributedOptimizer::ElasticDistributedOptimizer(::torch::optim::Optimizer& optimizer,
                                                         NamedTensors named_parameters,
                                                         DistributedOptimizerOptions options)
    : optimizer_(optimizer), params_(std::move(named_parameters)), options_(std::move(options)) {
  attach();
}

void ElasticDistributedOptimizer::zero_grad() {
  if (inner_) inner_->zero_grad();
}

void ElasticDistributedOptimizer::detach() {
  inner_.reset();  // its failed allreduces belong to the session that goes next
}

void ElasticDistributedOptimizer::attach() {
  inner_ = std::make_unique<DistributedOptimizer>(optimizer_, params_, options_);
}

TorchState::TorchState(::torch::nn::Module& model, ::torch::optim::Optimizer& optimizer)
    : State(default_comm), model_(model), optimizer_(optimizer) {
  save();
}

void TorchState::add_bytes(const std::string& name, void* data, size_t bytes) {
  Value v{data, std::vector<std::byte>(bytes)};
  if (bytes) std::memcpy(v.saved.data(), data, bytes);
  values_[name] = std::move(v);
}

void TorchState::save() {
  ::torch::NoGradGuard no_grad;
  saved_params_.clear();
  saved_buffers_.clear();
  for (const auto& p : model_.parameters())
    saved_params_.push_back(p.detach().clone());
  for (const auto& b : model_.buffers())
    saved_buffers_.push_back(b.detach().clone());
  saved_optimizer_ = save_optimizer(optimizer_);
  for (auto& [name, v] : values_)
    if (!v.saved.empty()) std::memcpy(v.saved.data(), v.data, v.saved.size());
}

void TorchState::restore() {
  ::torch::NoGradGuard no_grad;
  auto params = model_.parameters();
  for (size_t i = 0; i < params.size() && i < saved_params_.size(); ++i)
    params[i].copy_(saved_params_[i]);
  auto buffers = model_.buffers();
  for (size_t i = 0; i < buffers.size() && i < saved_buffers_.size(); ++i)
    buffers[i].copy_(saved_buffers_[i]);
  for (auto& p : params)
    if (p.grad().defined()) p.grad().zero_();
  load_optimizer(optimizer_, saved_optimizer_);
  for (auto& [name, v] : values_)
    if (!v.saved.empty()) std::memcpy(v.data, v.saved.data(), v.saved.size());
}

void TorchState::sync() {
  // Fixed names ("broadcast_parameters.<name>", ...): the same on every
  // member, newcomers included.
  broadcast_parameters(named(model_.named_parameters()), 0);
  auto buffers = named(model_.named_buffers());
  if (!buffers.empty()) broadcast_parameters(buffers, 0);
  broadcast_optimizer_state(optimizer_, 0);
  for (auto& [name, v] : values_) {
    if (v.saved.empty()) continue;
    ArrayView view(v.data, DType::kUInt8, Shape{static_cast<int64_t>(v.saved.size())});
    default_comm().broadcast("elastic.sync." + name, view, 0);
  }
  save();
}

void run(TorchState& state, const std::function<void()>& fn) {
  collective::elastic::run(state, fn, [&state] {
    for (auto* o : state.tracked())
      o->detach();
    collective::shutdown();
    collective::init();
    for (auto* o : state.tracked())
      o->attach();
  });
}

}  // namespace pushpull::torch::elastic
