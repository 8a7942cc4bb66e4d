// SPDX-License-Identifier: Apache-2.0
// Checkpoint files (ps/checkpoint.h) and a ServerStore writing and restoring
// them (docs/ps.md, "Checkpoints").
#include "ps/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "base/file_codec.h"
#include "ps/server_store.h"
#include "pushpull/error.h"

namespace pushpull::ps {
namespace {

using ::testing::HasSubstr;

struct TempDir {
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "pp-ckpt-XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string path;
};

CheckpointPart part(uint64_t key, int64_t begin, const std::string& name, Array a,
                    std::string states = "") {
  auto owner = std::make_shared<Array>(std::move(a));
  return CheckpointPart{key, begin, 1, name, owner->view(), owner, std::move(states)};
}

Checkpoint sample() {
  Checkpoint c{3, 1, 2, 40, {}};
  c.parts.push_back(part(7, 0, "w", Array::full(Shape{2, 3}, 2.5)));
  c.parts.push_back(part(9, 4000, "big", Array::full(Shape{5}, 3.0, DType::kFloat16), "opt"));
  return c;
}

const CheckpointLayout kLayout{3, 1, 2};
const base::FileKey kKey = base::file_key_from_secret("test secret", "the test secret");

std::string message_of(std::string_view bytes, const CheckpointLayout& l = kLayout,
                       const base::FileKey& key = kKey) {
  try {
    decode_checkpoint(bytes, "F", l, key);
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

TEST(Checkpoint, RoundTrips) {
  std::string bytes = encode_checkpoint(sample(), kKey);
  Checkpoint c = decode_checkpoint(bytes, "F", kLayout, kKey);
  EXPECT_EQ(c.round, 40);
  ASSERT_EQ(c.parts.size(), 2u);
  EXPECT_EQ(c.parts[0].key, 7u);
  EXPECT_EQ(c.parts[0].name, "w");
  EXPECT_EQ(c.parts[0].home, 1);
  EXPECT_EQ(c.parts[0].value.shape, (Shape{2, 3}));
  EXPECT_EQ(get_element(c.parts[0].value, 5), 2.5);
  EXPECT_EQ(c.parts[1].begin, 4000);
  EXPECT_EQ(c.parts[1].value.dtype, DType::kFloat16);
  EXPECT_EQ(get_element(c.parts[1].value, 4), 3.0);
  EXPECT_EQ(c.parts[1].optimizer_states, "opt");
}

TEST(Checkpoint, EveryTruncationIsRefusedNamingTheFile) {
  std::string bytes = encode_checkpoint(sample(), kKey);
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_THAT(message_of(bytes.substr(0, n)), HasSubstr("checkpoint 'F'")) << n;
}

TEST(Checkpoint, EveryFlippedByteIsRefused) {
  std::string bytes = encode_checkpoint(sample(), kKey);
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x20;
    EXPECT_THAT(message_of(bad), HasSubstr("checkpoint 'F'")) << i;
  }
}

TEST(Checkpoint, AForeignLayoutIsRefused) {
  std::string bytes = encode_checkpoint(sample(), kKey);
  EXPECT_THAT(message_of(bytes, {2, 1, 2}), HasSubstr("another job layout"));
  EXPECT_THAT(message_of(bytes, {3, 0, 2}), HasSubstr("another job layout"));
  EXPECT_THAT(message_of(bytes, {3, 1, 4}), HasSubstr("another job layout"));
}

// The key comes from the user's secret (here: another secret file through
// PUSHPULL_SECRET_FILE, as the tests' processes get one): a file tagged with
// another key is refused as another user's, naming the file and the fix.
TEST(Checkpoint, AFileOfAnotherKeyIsRefused) {
  TempDir dir;
  const base::FileKey mine =
      base::checkpoint_key(Environment{{"PUSHPULL_SECRET_FILE", dir.path + "/mine"}});
  const base::FileKey theirs =
      base::checkpoint_key(Environment{{"PUSHPULL_SECRET_FILE", dir.path + "/theirs"}});
  ASSERT_NE(mine.key, theirs.key);
  EXPECT_EQ(mine.key,
            base::checkpoint_key(Environment{{"PUSHPULL_SECRET_FILE", dir.path + "/mine"}}).key);
  const std::string bytes = encode_checkpoint(sample(), theirs);
  const std::string why = message_of(bytes, kLayout, mine);
  EXPECT_THAT(why, HasSubstr("checkpoint 'F'"));
  EXPECT_THAT(why, HasSubstr("written by another user or with another secret"));
  EXPECT_THAT(why, HasSubstr(dir.path + "/mine"));  // where this process's key comes from
  EXPECT_THAT(why, HasSubstr("PUSHPULL_CHECKPOINT_KEY_FILE"));
  // Its key id copied into the file (it is not secret) does not help: the tag fails.
  std::string forged = bytes;
  forged.replace(12, base::kFileKeyIdBytes, mine.id);
  EXPECT_THAT(message_of(forged, kLayout, mine), HasSubstr("authentication tag mismatch"));
  EXPECT_EQ(decode_checkpoint(encode_checkpoint(sample(), mine), "F", kLayout, mine).round, 40);
  // PUSHPULL_CHECKPOINT_KEY_FILE wins over the per-user file; the job
  // secret is never the key.
  const base::FileKey file_key =
      base::checkpoint_key(Environment{{"PUSHPULL_SECRET_FILE", dir.path + "/mine"},
                                       {"PUSHPULL_CHECKPOINT_KEY_FILE", dir.path + "/theirs"},
                                       {"PUSHPULL_JOB_SECRET", "per-job"}});
  EXPECT_EQ(file_key.key, theirs.key);
  EXPECT_THAT(file_key.source, HasSubstr("PUSHPULL_CHECKPOINT_KEY_FILE"));
  EXPECT_FALSE(mine.allow_unauthenticated);
  EXPECT_TRUE(base::checkpoint_key(Environment{{"PUSHPULL_SECRET_FILE", dir.path + "/mine"},
                                               {"PUSHPULL_ALLOW_INSECURE", "1"}})
                  .allow_unauthenticated);
  // A server whose key differs from the launcher's stops at start-up.
  EXPECT_NO_THROW(
      base::check_key_id(mine, Environment{{"PUSHPULL_CHECKPOINT_KEY_ID", mine.id_hex()}}, "s"));
  EXPECT_NO_THROW(base::check_key_id(mine, Environment{}, "s"));
  try {
    base::check_key_id(mine, Environment{{"PUSHPULL_CHECKPOINT_KEY_ID", theirs.id_hex()}},
                       "server 2");
    FAIL() << "another host's key was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("server 2: the launcher"));
    EXPECT_THAT(e.what(), HasSubstr("PUSHPULL_CHECKPOINT_KEY_FILE"));
  }
}

// Version 1 (an FNV-1a checksum, no tag) is read only with
// PUSHPULL_ALLOW_INSECURE=1; otherwise the error says how to re-save.
TEST(Checkpoint, AnUnauthenticatedVersion1FileNeedsAllowInsecure) {
  const std::string v2 = encode_checkpoint(sample(), kKey);
  std::string v1(v2.data(), 8);
  base::put_le(v1, uint32_t{1});
  v1.append(v2, 12 + base::kFileKeyIdBytes,
            v2.size() - 12 - base::kFileKeyIdBytes - base::kFileTagBytes);
  base::put_le(v1, base::fnv1a(v1.data(), v1.size()));
  const std::string why = message_of(v1);
  EXPECT_THAT(why, HasSubstr("checkpoint 'F'"));
  EXPECT_THAT(why, HasSubstr("not authenticated"));
  EXPECT_THAT(why, HasSubstr("PUSHPULL_ALLOW_INSECURE=1"));
  base::FileKey insecure = kKey;
  insecure.allow_unauthenticated = true;
  Checkpoint c = decode_checkpoint(v1, "F", kLayout, insecure);
  EXPECT_EQ(c.round, 40);
  ASSERT_EQ(c.parts.size(), 2u);
  EXPECT_EQ(c.parts[1].optimizer_states, "opt");
  // A flipped byte in a version-1 file is still refused (its checksum).
  v1[30] ^= 1;
  EXPECT_THAT(message_of(v1, kLayout, insecure), HasSubstr("checksum mismatch"));
  // Tagged files are checked even then.
  std::string bad = v2;
  bad[40] ^= 1;
  EXPECT_THAT(message_of(bad, kLayout, insecure), HasSubstr("authentication tag mismatch"));
}

TEST(Checkpoint, OnlyRoundsWithEveryServersFileAreComplete) {
  TempDir dir;
  EXPECT_FALSE(last_complete_checkpoint(dir.path, 2).has_value());
  write_file_atomically(checkpoint_path(dir.path, 5, 0), "a");
  write_file_atomically(checkpoint_path(dir.path, 5, 1), "b");
  write_file_atomically(checkpoint_path(dir.path, 10, 0), "c");  // server 1's is missing
  EXPECT_EQ(last_complete_checkpoint(dir.path, 2), 5);
  EXPECT_FALSE(std::filesystem::exists(checkpoint_path(dir.path, 5, 0) + ".tmp"));
  EXPECT_THROW(last_complete_checkpoint(dir.path + "/nope", 2), IoError);
}

TEST(Checkpoint, AResumeSetsAsideTheCrashedRunsLaterRounds) {
  // The crashed run wrote server 0's file of round 10 and died; the resumed
  // run (from round 5) writes server 1's file of round 10 and dies too:
  // without setting aside the old file, round 10 would look complete,
  // assembled from two runs.
  TempDir dir;
  write_file_atomically(checkpoint_path(dir.path, 5, 0), "a");
  write_file_atomically(checkpoint_path(dir.path, 5, 1), "b");
  write_file_atomically(checkpoint_path(dir.path, 10, 0), "old run");
  auto moved = set_aside_rounds_after(dir.path, 5);
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_THAT(moved[0], ::testing::HasSubstr("round-0000000010.abandoned-5"));
  write_file_atomically(checkpoint_path(dir.path, 10, 1), "new run");
  EXPECT_EQ(last_complete_checkpoint(dir.path, 2), 5);
  EXPECT_TRUE(std::filesystem::exists(checkpoint_path(dir.path, 5, 0)));
}

// A symlink planted at a checkpoint's name (shared directory, predictable
// name) is replaced, never written through; another user's file there is
// refused; the round directory is 0700 and the file 0600.
TEST(Checkpoint, FilesAreWrittenPrivatelyNeverThroughASymlink) {
  TempDir dir;
  ::chmod(dir.path.c_str(), 01777);  // a shared directory, like /tmp
  const std::string victim = dir.path + "/victim";
  std::ofstream(victim) << "precious";
  const std::string path = checkpoint_path(dir.path, 7, 0);
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  ::chmod(std::filesystem::path(path).parent_path().c_str(), 0755);
  std::filesystem::create_symlink(victim, path);
  write_file_atomically(path, "checkpoint bytes");
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  std::ifstream in(victim);
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "precious");
  // A round directory the checkpoint makes is 0700.
  const std::string fresh = checkpoint_path(dir.path, 8, 0);
  write_file_atomically(fresh, "x");
  ASSERT_EQ(::stat(std::filesystem::path(fresh).parent_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);

  if (::geteuid() != 0) GTEST_SKIP() << "needs root and setpriv to act as uid 65534";
  // A round directory made by another user (uid 65534) is refused, and so
  // is their file in a directory of ours.
  const std::string theirs = checkpoint_path(dir.path, 9, 0);
  const std::string dir9 = std::filesystem::path(theirs).parent_path().string();
  ASSERT_EQ(
      std::system(("setpriv --reuid=65534 --regid=65534 --clear-groups mkdir " + dir9).c_str()), 0);
  try {
    write_file_atomically(theirs, "x");
    FAIL() << "wrote into another user's directory";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr(dir9));
    EXPECT_THAT(e.what(), HasSubstr("owned by uid 65534"));
  }
  const std::string planted = dir.path + "/round-0000000010";
  std::filesystem::create_directories(planted);
  ::chmod(planted.c_str(), 01777);
  const std::string file10 = checkpoint_path(dir.path, 10, 0);
  ASSERT_EQ(std::system(("setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'echo theirs "
                         "> " +
                         file10 + "'")
                            .c_str()),
            0);
  try {
    write_file_atomically(file10, "x");
    FAIL() << "replaced another user's file";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr(file10));
    EXPECT_THAT(e.what(), HasSubstr("owned by uid 65534"));
  }
}

class Recorder : public ServerResponder {
 public:
  void reply(const RequestMeta& to, const Status& s, DType, std::span<const std::byte> data,
             std::shared_ptr<void>) override {
    std::lock_guard lock(mu_);
    replies[to.request_id] = {s, {data.begin(), data.end()}};
  }
  std::mutex mu_;
  std::map<uint64_t, std::pair<Status, std::vector<std::byte>>> replies;
};

Payload payload(Array a) {
  auto owner = std::make_shared<Array>(std::move(a));
  return Payload{owner->view(), owner};
}

TEST(Checkpoint, AStoreWritesEveryNRoundsAndResumesFromIt) {
  TempDir dir;
  Recorder rec;
  ServerStoreConfig config{2, true, 2, 0};
  config.checkpoint_every = 2;
  config.checkpoint_dir = dir.path;
  config.checkpoint_key = kKey;
  uint64_t id = 0;
  {
    ServerStore store(config, rec);
    store.init({0, ++id}, {1, 0}, "a", payload(Array::full(Shape{4}, 1.0)));
    store.init({0, ++id}, {2, 0}, "b", payload(Array::full(Shape{3}, 0.0, DType::kFloat16)));
    // Both keys exist before the first round, as in a job (its workers init
    // every key, then pass a barrier): a checkpoint is of the keys known then,
    // and a loaded shard could otherwise run "a" to round 4 before "b" exists.
    store.wait_idle(Millis(10000));
    for (int round = 1; round <= 5; ++round)
      for (int w = 0; w < 2; ++w) {
        store.push({w, ++id}, {1, 0}, payload(Array::full(Shape{4}, w + 1.0)), false);
        store.push({w, ++id}, {2, 0}, payload(Array::full(Shape{3}, 1.0, DType::kFloat16)), false);
      }
    store.wait_idle(Millis(10000));
  }
  EXPECT_EQ(last_complete_checkpoint(dir.path, 1), 4);
  Checkpoint c = read_checkpoint(checkpoint_path(dir.path, 4, 0), {1, 0, 2}, kKey);
  ASSERT_EQ(c.parts.size(), 2u);

  ServerStore resumed(config, rec);
  resumed.restore(c, "the file");
  // The same init is a no-op; another shape is refused naming the file.
  uint64_t same = ++id, other = ++id, pulled = ++id;
  resumed.init({0, same}, {1, 0}, "a", payload(Array::full(Shape{4}, 9.0)));
  resumed.init({0, other}, {2, 0}, "b", payload(Array::full(Shape{5}, 0.0, DType::kFloat16)));
  resumed.pull({1, pulled}, {1, 0}, {});
  resumed.wait_idle(Millis(10000));
  std::lock_guard lock(rec.mu_);
  EXPECT_TRUE(rec.replies[same].first.is_ok()) << rec.replies[same].first.to_string();
  EXPECT_THAT(rec.replies[other].first.message(),
              HasSubstr("does not match checkpoint 'the file'"));
  const auto& bytes = rec.replies[pulled].second;
  ASSERT_EQ(bytes.size(), 16u);
  float v[4];
  std::memcpy(v, bytes.data(), 16);
  EXPECT_EQ(v[3], 3.0f);  // round 4: 1 + 2 (no optimizer: the sum replaces the value)
}

// Runs rounds `from`..`to` of one worker pushing (round / 4) into key 1 with
// momentum SGD; returns the pulled value. `restore`: resume from it first.
std::vector<float> train(ServerStoreConfig config, int from, int to,
                         const Checkpoint* restore = nullptr) {
  Recorder rec;
  ServerStore store(config, rec);
  if (restore) store.restore(*restore, "F");
  uint64_t id = 0;
  store.init({0, ++id}, {1, 0}, "w", payload(Array::full(Shape{3}, 1.0)));
  store.set_optimizer({0, ++id}, OptimizerSpec::parse("sgd:learning_rate=0.1,momentum=0.9"));
  for (int round = from; round <= to; ++round)
    store.push({0, ++id}, {1, 0}, payload(Array::full(Shape{3}, round / 4.0)), false);
  uint64_t pulled = ++id;
  store.pull({0, pulled}, {1, 0}, {});
  store.wait_idle(Millis(10000));
  std::lock_guard lock(rec.mu_);
  for (const auto& [rid, r] : rec.replies)
    EXPECT_TRUE(r.first.is_ok()) << rid << ": " << r.first.to_string();
  std::vector<float> v(3);
  EXPECT_EQ(rec.replies[pulled].second.size(), 12u);
  std::memcpy(v.data(), rec.replies[pulled].second.data(), 12);
  return v;
}

TEST(Checkpoint, OptimizerStatesResumeExactly) {
  TempDir dir;
  ServerStoreConfig config{1, true, 1, 0};
  const std::vector<float> uninterrupted = train(config, 1, 7);
  config.checkpoint_every = 3;
  config.checkpoint_dir = dir.path;
  config.checkpoint_key = kKey;
  train(config, 1, 4);  // "killed" after round 4: the checkpoint of round 3 stands
  ASSERT_EQ(last_complete_checkpoint(dir.path, 1), 3);
  Checkpoint c = read_checkpoint(checkpoint_path(dir.path, 3, 0), {1, 0, 1}, kKey);
  ASSERT_EQ(c.parts.size(), 1u);
  EXPECT_FALSE(c.parts[0].optimizer_states.empty());
  EXPECT_EQ(train(config, 4, 7, &c), uninterrupted);
  // Rounds continue from the checkpoint's: the resumed store wrote round 6.
  EXPECT_EQ(last_complete_checkpoint(dir.path, 1), 6);
}

TEST(Checkpoint, ARangeNeverPushedDoesNotPileUpPendingRounds) {
  TempDir dir;
  Recorder rec;
  ServerStoreConfig config{1, true, 1, 0};
  config.checkpoint_every = 1;
  config.checkpoint_dir = dir.path;
  config.checkpoint_key = kKey;
  ServerStore store(config, rec);
  uint64_t id = 0;
  store.init({0, ++id}, {1, 0}, "pushed", payload(Array::full(Shape{2}, 1.0)));
  store.init({0, ++id}, {2, 0}, "frozen", payload(Array::full(Shape{2}, 1.0)));
  for (int round = 1; round <= 20; ++round)
    store.push({0, ++id}, {1, 0}, payload(Array::full(Shape{2}, 1.0)), false);
  store.wait_idle(Millis(10000));
  // No round is complete (and the store kept at most a few pending).
  EXPECT_FALSE(last_complete_checkpoint(dir.path, 1).has_value());
}

}  // namespace
}  // namespace pushpull::ps
