// SPDX-License-Identifier: Apache-2.0
// The optimizer-state file of a parameter-server job (kvstore/states_file.h):
// authenticated like checkpoints, every file another key wrote, a modified
// or a truncated one refused with an error naming the file.
#include "kvstore/states_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "base/file_codec.h"
#include "pushpull/error.h"

namespace pushpull::kv {
namespace {

using ::testing::HasSubstr;

const base::FileKey kKey = base::file_key_from_secret("test secret", "the test secret");
const std::vector<std::string> kStates = {"server zero's states", std::string(300, 'x'), ""};

// What decoding `bytes` throws ("" when it is accepted).
std::string message_of(std::string_view bytes, const base::FileKey& key = kKey, int servers = 3) {
  try {
    decode_states_file(bytes, "F", servers, key);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Version 1: magic, version, servers, the blobs; no key id, no tag.
std::string version_1(const std::vector<std::string>& states) {
  std::string v1 = "PPDS";
  base::put_le(v1, uint32_t{1});
  base::put_le(v1, static_cast<uint32_t>(states.size()));
  for (const auto& s : states) {
    base::put_le(v1, static_cast<uint64_t>(s.size()));
    v1 += s;
  }
  return v1;
}

TEST(StatesFile, RoundTrips) {
  const std::string bytes = encode_states_file(kStates, kKey);
  EXPECT_EQ(decode_states_file(bytes, "F", 3, kKey), kStates);
  EXPECT_EQ(bytes.substr(8, base::kFileKeyIdBytes), kKey.id);  // the key id in the header
}

TEST(StatesFile, EveryTruncationIsRefusedNamingTheFile) {
  const std::string bytes = encode_states_file(kStates, kKey);
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::string why = message_of(bytes.substr(0, n));
    EXPECT_THAT(why, HasSubstr("load_optimizer_states: 'F'")) << n;
    // Cut inside the tag or the body: the tag does not match.
    if (n >= 8 + base::kFileKeyIdBytes + base::kFileTagBytes) {
      EXPECT_THAT(why, HasSubstr("authentication tag mismatch")) << n;
    }
  }
}

TEST(StatesFile, EveryFlippedByteIsRefused) {
  const std::string bytes = encode_states_file(kStates, kKey);
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x20;
    EXPECT_THAT(message_of(bad), HasSubstr("load_optimizer_states: 'F'")) << i;
  }
  // One changed byte of a server's states, past the header: the tag.
  std::string bad = bytes;
  bad[40] ^= 1;
  EXPECT_THAT(message_of(bad), HasSubstr("authentication tag mismatch"));
  // Bytes appended after the tag.
  EXPECT_THAT(message_of(bytes + "x"), HasSubstr("authentication tag mismatch"));
}

// Another user's (or another secret's) file: refused as such, naming where
// this process's key comes from and how to share one across hosts; copying
// this key's id into the file does not help.
TEST(StatesFile, AFileOfAnotherKeyIsRefused) {
  std::string dir = (std::filesystem::temp_directory_path() / "pp-states-XXXXXX").string();
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const base::FileKey mine =
      base::checkpoint_key(Environment{{"PUSHPULL_SECRET_FILE", dir + "/mine"}});
  const base::FileKey theirs =
      base::checkpoint_key(Environment{{"PUSHPULL_SECRET_FILE", dir + "/theirs"}});
  ASSERT_NE(mine.key, theirs.key);
  const std::string bytes = encode_states_file(kStates, theirs);
  const std::string why = message_of(bytes, mine);
  EXPECT_THAT(why, HasSubstr("load_optimizer_states: 'F'"));
  EXPECT_THAT(why, HasSubstr("written by another user or with another secret"));
  EXPECT_THAT(why, HasSubstr(theirs.id_hex()));
  EXPECT_THAT(why, HasSubstr(dir + "/mine"));
  EXPECT_THAT(why, HasSubstr("PUSHPULL_CHECKPOINT_KEY_FILE"));
  std::string forged = bytes;
  forged.replace(8, base::kFileKeyIdBytes, mine.id);
  EXPECT_THAT(message_of(forged, mine), HasSubstr("authentication tag mismatch"));
  // Allowing unauthenticated files changes nothing for a tagged one.
  base::FileKey insecure = mine;
  insecure.allow_unauthenticated = true;
  EXPECT_THAT(message_of(bytes, insecure), HasSubstr("written by another user"));
  EXPECT_EQ(decode_states_file(encode_states_file(kStates, mine), "F", 3, mine), kStates);
  std::filesystem::remove_all(dir);
}

// Version 1 files (before authentication) are read only with
// PUSHPULL_ALLOW_INSECURE=1, as checkpoints of version 1; otherwise the
// error says how to re-save them.
TEST(StatesFile, AnUnauthenticatedVersion1FileNeedsAllowInsecure) {
  const std::string v1 = version_1(kStates);
  const std::string why = message_of(v1);
  EXPECT_THAT(why, HasSubstr("load_optimizer_states: 'F'"));
  EXPECT_THAT(why, HasSubstr("format version 1 is not authenticated"));
  EXPECT_THAT(why, HasSubstr("PUSHPULL_ALLOW_INSECURE=1"));
  base::FileKey insecure = kKey;
  insecure.allow_unauthenticated = true;
  EXPECT_EQ(decode_states_file(v1, "F", 3, insecure), kStates);
  // Still bounds-checked: torn, trailing bytes, a length past the end.
  EXPECT_THAT(message_of(v1.substr(0, v1.size() - 1), insecure), HasSubstr("truncated"));
  EXPECT_THAT(message_of(v1 + "x", insecure), HasSubstr("trailing bytes"));
  std::string huge = version_1({"x"});
  huge.replace(12, 8, std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8));
  EXPECT_THAT(message_of(huge, insecure, 1), HasSubstr("truncated"));
}

TEST(StatesFile, OtherFilesAndOtherJobsAreRefused) {
  EXPECT_THAT(message_of("garbage, not a states file"),
              HasSubstr("not a distributed optimizer-state file (bad magic)"));
  EXPECT_THAT(message_of("PPD"), HasSubstr("truncated"));
  std::string v9 = encode_states_file(kStates, kKey);
  v9[4] = 9;
  EXPECT_THAT(message_of(v9), HasSubstr("format version 9"));
  // An authentic file of a job with another server count.
  try {
    decode_states_file(encode_states_file(kStates, kKey), "F", 2, kKey);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("saved by a job with 3 servers; this job has 2"));
  }
  EXPECT_THROW(encode_states_file(kStates, base::FileKey{}), InvalidArgument);
}

}  // namespace
}  // namespace pushpull::kv
