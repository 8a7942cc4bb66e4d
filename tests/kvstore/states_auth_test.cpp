// SPDX-License-Identifier: Apache-2.0
// A parameter-server job's optimizer-state files are authenticated
// (kvstore/states_file.h, docs/security.md): end to end, a job saves a file
// tagged with its user's key, and refuses to load one another key wrote, a
// modified one and a truncated one, with an error naming the file, before
// anything reaches the servers; its own file still loads.
#include <sys/stat.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/file_auth.h"
#include "kvstore/inprocess_job.h"
#include "kvstore/states_file.h"
#include "pushpull/error.h"

namespace pushpull {
namespace {

using ::testing::HasSubstr;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return std::move(ss).str();
}

void write_all(const std::string& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
}

struct TempDir {
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "pp-states-XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string path;
};

TEST(DistStoreStates, FilesAreAuthenticatedAndForeignOrModifiedOnesRefused) {
  TempDir dir;
  const Environment mine_env{{"PUSHPULL_SECRET_FILE", dir.path + "/mine"}};
  const std::string states = dir.path + "/states";
  InProcessJob job{2, 1, "dist_sync", Options{}};
  job.options.cluster.startup_timeout = Millis(30000);
  job.options.kvstore.wait_timeout = Millis(30000);
  job.options.kvstore.bigarray_bound = 1000;  // key 1 split over both servers
  job.options.kvstore.file_key_env = mine_env;
  run_inprocess_job(job, [&](KVStore& kv) {
    kv.init(1, Array::full(Shape{2000}, 1.0).view());
    kv.set_optimizer(OptimizerSpec::parse("sgd:learning_rate=0.1,momentum=0.9"));
    kv.push(1, Array::full(Shape{2000}, 0.5).view());
    kv.save_optimizer_states(states);

    // The file: 0600, version 2, tagged with this user's key.
    struct stat st {};
    ASSERT_EQ(::stat(states.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    const std::string bytes = read_all(states);
    const base::FileKey mine = base::checkpoint_key(mine_env);
    ASSERT_GT(bytes.size(), 48u);
    EXPECT_EQ(bytes.substr(0, 4), "PPDS");
    EXPECT_EQ(bytes[4], 2);
    EXPECT_EQ(bytes.substr(8, base::kFileKeyIdBytes), mine.id);
    const std::vector<std::string> per_server = kv::decode_states_file(bytes, "F", 2, mine);

    // Another user's (another secret file's) file of the same states.
    const base::FileKey theirs =
        base::checkpoint_key(Environment{{"PUSHPULL_SECRET_FILE", dir.path + "/theirs"}});
    write_all(dir.path + "/theirs.states", kv::encode_states_file(per_server, theirs));
    std::string flipped = bytes;
    flipped[bytes.size() / 2] ^= 1;
    write_all(dir.path + "/flipped.states", flipped);
    write_all(dir.path + "/cut.states", bytes.substr(0, bytes.size() - 10));
    write_all(dir.path + "/header.states", bytes.substr(0, 20));
    const std::pair<const char*, const char*> cases[] = {
        {"theirs", "written by another user or with another secret"},
        {"flipped", "authentication tag mismatch"},
        {"cut", "authentication tag mismatch"},
        {"header", "truncated"},
    };
    for (const auto& [name, why] : cases) {
      const std::string path = dir.path + "/" + name + ".states";
      try {
        kv.load_optimizer_states(path);
        ADD_FAILURE() << name << " was loaded";
      } catch (const IoError& e) {
        EXPECT_THAT(e.what(), HasSubstr("load_optimizer_states: '" + path + "'")) << name;
        EXPECT_THAT(e.what(), HasSubstr(why)) << name;
      }
    }
    // Its own file loads, and the job goes on.
    kv.load_optimizer_states(states);
    kv.push(1, Array::full(Shape{2000}, 0.5).view());
    Array out(Shape{2000}, DType::kFloat32);
    kv.pull(1, out.view());
    // sgd with momentum 0.9 from the saved states: v = 0.9 * -0.05 - 0.05.
    EXPECT_NEAR(out.as<float>()[0], 1.0f - 0.05f - 0.095f, 1e-6);
    EXPECT_NEAR(out.as<float>()[1999], 1.0f - 0.05f - 0.095f, 1e-6);
  });
}

}  // namespace
}  // namespace pushpull
