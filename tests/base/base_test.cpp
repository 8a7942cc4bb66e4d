// SPDX-License-Identifier: Apache-2.0
// Errors, arrays, options and logging.
#include <gtest/gtest.h>

#include "pushpull/array.h"
#include "pushpull/error.h"
#include "pushpull/log.h"
#include "pushpull/options.h"

namespace pushpull {
namespace {

TEST(Error, TypedHierarchy) {
  EXPECT_THROW(throw_error(ErrorCode::kTimeout, "t"), Timeout);
  EXPECT_THROW(throw_error(ErrorCode::kPeerFailure, "p"), PeerFailure);
  try {
    throw_error(ErrorCode::kInvalidArgument, "bad key 3");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_STREQ(e.what(), "bad key 3");
  }
  Status s(ErrorCode::kIoError, "connect failed");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.to_string(), "IoError: connect failed");
  EXPECT_THROW(s.raise(), IoError);
  EXPECT_NO_THROW(Status::ok().raise());
  try {
    throw NotFound("x");
  } catch (...) {
    EXPECT_EQ(Status::from_current_exception().code(), ErrorCode::kNotFound);
  }
}

TEST(Array, ShapeAndBytes) {
  Shape s{2, 3};
  EXPECT_EQ(s.ndim(), 2);
  EXPECT_EQ(s.numel(), 6);
  EXPECT_EQ(s.to_string(), "(2, 3)");
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ((Shape{4, 0}).numel(), 0);
  EXPECT_THROW((Shape{1, 2, 3, 4, 5, 6, 7, 8, 9}), InvalidArgument);
  EXPECT_THROW((Shape{-1}), InvalidArgument);

  Array a(Shape{2, 3}, DType::kFloat16);
  EXPECT_EQ(a.nbytes(), 12u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  EXPECT_EQ(get_element(a, 5), 0.0);
  set_element(a, 5, 1.5);
  Array b = Array::copy_of(a);
  EXPECT_EQ(get_element(b, 5), 1.5);
  EXPECT_EQ(b.view().describe(), "float16(2, 3) on cpu(0)");
  EXPECT_THROW(Array(Shape{1}, DType::kFloat32, Device::cuda(0)), InvalidArgument);

  float raw[4] = {1, 2, 3, 4};
  ArrayView v(raw, Shape{2, 2});
  EXPECT_EQ(v.dtype, DType::kFloat32);
  EXPECT_EQ(v.nbytes(), 16u);
}

TEST(Options, DefaultsAndDmlcNames) {
  Options d = Options::from_env(Environment{});
  EXPECT_EQ(d.cluster.role, Role::kNone);
  EXPECT_EQ(d.kvstore.bigarray_bound, 65536);
  EXPECT_EQ(d.net.socket_buffer_bytes, -1);  // automatic (transport::auto_socket_buffer_bytes)
  EXPECT_EQ(d.collective.fusion_threshold_bytes, 64u << 20);
  EXPECT_EQ(d.collective.shm_min_message_bytes, 512u << 10);
  EXPECT_EQ(d.collective.shm_arena_slot_bytes, 1u << 20);
  EXPECT_EQ(d.collective.shm_arena_step_bytes, 128u << 10);
  EXPECT_EQ(d.collective.shm_arena_stores, "auto");
  EXPECT_EQ(d.cluster.heartbeat_interval, Millis(1000));

  Environment env{{"DMLC_ROLE", "server"},
                  {"DMLC_PS_ROOT_URI", "10.0.0.1"},
                  {"DMLC_PS_ROOT_PORT", "9000"},
                  {"DMLC_NUM_SERVER", "2"},
                  {"DMLC_NUM_WORKER", "3"},
                  {"MXNET_KVSTORE_BIGARRAY_BOUND", "1000"},
                  {"PUSHPULL_BIGARRAY_BOUND", "2000"},
                  {"PUSHPULL_TIMEOUT", "7"},
                  {"RANK", "1"},
                  {"WORLD_SIZE", "3"},
                  {"PUSHPULL_LOG_LEVEL", "debug"},
                  {"PUSHPULL_SHM_MIN_MESSAGE_BYTES", "0"},
                  {"PUSHPULL_SHM_ARENA_SLOT_BYTES", "0"},
                  {"PUSHPULL_SHM_ARENA_STEP_BYTES", "1048576"},
                  {"PUSHPULL_SHM_ARENA_STORES", "streaming"}};
  const LogLevel before = log_level();
  Options o = Options::from_env(env);
  // Reading the environment applies the level too (a library user's
  // PUSHPULL_LOG_LEVEL works without a set_log_level call of its own).
  EXPECT_EQ(o.log_level, LogLevel::kDebug);
  EXPECT_EQ(log_level(), LogLevel::kDebug);
  set_log_level(before);
  EXPECT_EQ(o.collective.shm_min_message_bytes, 0u);
  EXPECT_EQ(o.collective.shm_arena_slot_bytes, 0u);  // no arena
  EXPECT_EQ(o.collective.shm_arena_step_bytes, 1u << 20);
  EXPECT_EQ(o.collective.shm_arena_stores, "streaming");
  EXPECT_EQ(o.cluster.role, Role::kServer);
  EXPECT_EQ(o.cluster.root_uri, "10.0.0.1");
  EXPECT_EQ(o.cluster.root_port, 9000);
  EXPECT_EQ(o.cluster.num_servers, 2);
  EXPECT_EQ(o.cluster.num_workers, 3);
  EXPECT_EQ(o.kvstore.bigarray_bound, 2000);  // PUSHPULL_ wins
  EXPECT_EQ(o.cluster.heartbeat_timeout, Millis(7000));
  EXPECT_EQ(o.collective.rank, 1);
  EXPECT_EQ(o.collective.size, 3);
  EXPECT_EQ(o.log_level, LogLevel::kDebug);
}

// The optimizer-state files' key (base::checkpoint_key) is derived later,
// from the variables from_env() kept: those and no others.
TEST(Options, KeepsTheVariablesOfTheFileKey) {
  Options o = Options::from_env(Environment{{"PUSHPULL_JOB_SECRET", "per-job"},
                                            {"PUSHPULL_CHECKPOINT_KEY_FILE", "/keys/k"},
                                            {"HOME", "/home/u"},
                                            {"RANK", "0"}});
  EXPECT_EQ(o.kvstore.file_key_env.get("PUSHPULL_CHECKPOINT_KEY_FILE"), "/keys/k");
  EXPECT_EQ(o.kvstore.file_key_env.get("HOME"), "/home/u");
  EXPECT_FALSE(o.kvstore.file_key_env.get("PUSHPULL_JOB_SECRET"));  // never the job secret
  EXPECT_FALSE(o.kvstore.file_key_env.get("RANK"));
}

// A server reads its checkpoint settings from Options, never the process
// environment, so an embedded or test-built Options is what it follows.
TEST(Options, CheckpointAndResumeSettings) {
  Options d = Options::from_env(Environment{});
  EXPECT_TRUE(d.kvstore.checkpoint_dir.empty());
  EXPECT_TRUE(d.kvstore.resume_dir.empty());
  Options o = Options::from_env(Environment{{"PUSHPULL_CHECKPOINT_DIR", "/ck"},
                                            {"PUSHPULL_CHECKPOINT_EVERY", "5"},
                                            {"PUSHPULL_RESUME_DIR", "/old"},
                                            {"PUSHPULL_RESUME_ROUND", "40"},
                                            {"PUSHPULL_CHECKPOINT_KEY_ID", "abc"}});
  EXPECT_EQ(o.kvstore.checkpoint_dir, "/ck");
  EXPECT_EQ(o.kvstore.checkpoint_every, 5);
  EXPECT_EQ(o.kvstore.resume_dir, "/old");
  EXPECT_EQ(o.kvstore.resume_round, 40);
  EXPECT_EQ(o.kvstore.file_key_env.get("PUSHPULL_CHECKPOINT_KEY_ID"), "abc");
  EXPECT_THROW(Options::from_env(Environment{{"PUSHPULL_CHECKPOINT_EVERY", "-1"}}),
               InvalidArgument);
  EXPECT_THROW(Options::from_env(Environment{{"PUSHPULL_RESUME_ROUND", "x"}}), InvalidArgument);
}

// The timeline's settings come from Options too (src/base/timeline.cpp reads
// no variable itself): its file stem, and whether a role was named (a
// process known only by its rank writes F.rank<N>.json, docs/timeline.md).
TEST(Options, TimelineSettings) {
  ObserveOptions d = ObserveOptions::from_env(Environment{});
  EXPECT_TRUE(d.timeline.empty());
  EXPECT_FALSE(d.role_named);
  ObserveOptions hvd = ObserveOptions::from_env(
      Environment{{"PUSHPULL_TIMELINE", ""}, {"HOROVOD_TIMELINE", "/t/hvd"}, {"RANK", "2"}});
  EXPECT_EQ(hvd.timeline, "/t/hvd");  // an empty PUSHPULL_TIMELINE leaves Horovod's
  EXPECT_EQ(hvd.rank, 2);
  EXPECT_FALSE(hvd.role_named);
  ObserveOptions pp = ObserveOptions::from_env(Environment{
      {"PUSHPULL_TIMELINE", "/t/pp"}, {"HOROVOD_TIMELINE", "/t/hvd"}, {"DMLC_ROLE", "server"}});
  EXPECT_EQ(pp.timeline, "/t/pp");
  EXPECT_EQ(pp.role, "server");
  EXPECT_TRUE(pp.role_named);
}

TEST(Options, BadValuesNameTheVariable) {
  try {
    Options::from_env(Environment{{"DMLC_NUM_WORKER", "two"}});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("DMLC_NUM_WORKER"), std::string::npos);
  }
  EXPECT_THROW(Options::from_env(Environment{{"DMLC_ROLE", "boss"}}), InvalidArgument);
  EXPECT_THROW(Options::from_env(Environment{{"DMLC_NUM_WORKER", "0"}}), InvalidArgument);
  EXPECT_THROW(Options::from_env(Environment{{"PUSHPULL_LOG_LEVEL", "loud"}}), InvalidArgument);
  EXPECT_THROW(Options::from_env(Environment{{"PUSHPULL_SHM_ARENA_SLOT_BYTES", "100"}}),
               InvalidArgument);
  EXPECT_THROW(Options::from_env(Environment{{"PUSHPULL_SHM_ARENA_STEP_BYTES", "0"}}),
               InvalidArgument);
  try {
    Options::from_env(Environment{{"PUSHPULL_SHM_ARENA_STORES", "fast"}});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("PUSHPULL_SHM_ARENA_STORES must be auto, cached or "
                                         "streaming, got 'fast'"),
              std::string::npos)
        << e.what();
  }
}

TEST(Log, LevelsAndContext) {
  LogLevel l;
  EXPECT_TRUE(parse_log_level("warn", &l));
  EXPECT_EQ(l, LogLevel::kWarning);
  EXPECT_FALSE(parse_log_level("x", &l));
  auto before = log_level();
  set_log_level(LogLevel::kError);
  EXPECT_FALSE(log_enabled(LogLevel::kInfo));
  set_log_level(before);
  {
    ScopedLogContext ctx("worker 3");
    EXPECT_EQ(log_context(), "worker 3");
    {
      ScopedLogContext inner("server 1");
      EXPECT_EQ(log_context(), "server 1");
    }
    EXPECT_EQ(log_context(), "worker 3");
  }
  EXPECT_EQ(log_context(), "");
}

}  // namespace
}  // namespace pushpull
