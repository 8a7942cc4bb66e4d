// SPDX-License-Identifier: Apache-2.0
// compress/gathered.h: the rank-order sum of allgathered codes, and the
// checks sum_gathered makes before reading bytes another worker sent
// (length, header, settings), leaving the output untouched on an error.
#include "compress/gathered.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "compress/compressor.h"
#include "compress/one_bit.h"

namespace pushpull::compress {
namespace {

// `ranks` wire forms of n values back to back, rank r's gradient r - 1.2
// everywhere (every code of both types shows up across ranks).
std::vector<std::byte> gathered(const Settings& s, int ranks, size_t n) {
  std::vector<std::byte> all;
  for (int r = 0; r < ranks; ++r) {
    Compressor c(s);
    std::vector<float> g(n, static_cast<float>(r) - 1.2f);
    std::vector<std::byte> one(c.encoded_bytes(n));
    c.encode(0, 0, n, 0, g.data(), n, one.data());
    all.insert(all.end(), one.begin(), one.end());
  }
  return all;
}

// What rank r's first code stands for (zero residual), as two_bit.h / one_bit.h say.
float first_code(const Settings& s, float g) {
  if (s.type == Type::k2Bit)
    return g >= s.threshold ? s.threshold : (g <= -s.threshold ? -s.threshold : 0.0f);
  return g > s.threshold ? 1.0f : -1.0f;
}

TEST(SumGathered, SumsEveryRanksCodesInRankOrder) {
  const size_t n = 70001;  // three blocks of the sum, a partial last word
  for (Type type : {Type::k2Bit, Type::k1Bit}) {
    const Settings s{type, 0.5f};
    for (int ranks : {1, 3, 5}) {
      const auto all = gathered(s, ranks, n);
      std::vector<float> out(n, 99.0f);
      ASSERT_TRUE(sum_gathered(s, all, ranks, n, out.data()).is_ok());
      float want = 0.0f;
      for (int r = 0; r < ranks; ++r)
        want += first_code(s, static_cast<float>(r) - 1.2f);
      for (size_t i : {size_t{0}, size_t{31}, size_t{32768}, n - 1})
        ASSERT_EQ(out[i], want) << type_name(type) << " ranks " << ranks << " i " << i;
    }
  }
}

TEST(SumGathered, RefusesWrongLengthsHeadersAndSettingsWithoutTouchingTheOutput) {
  const size_t n = 100;
  const Settings s{Type::k1Bit, 0.5f};
  auto all = gathered(s, 3, n);
  std::vector<float> out(n, 42.0f);
  // One byte short, one too many, a rank count that does not match.
  auto shorter = all;
  shorter.pop_back();
  EXPECT_EQ(sum_gathered(s, shorter, 3, n, out.data()).code(), ErrorCode::kProtocolError);
  auto longer = all;
  longer.push_back(std::byte{0});
  EXPECT_EQ(sum_gathered(s, longer, 3, n, out.data()).code(), ErrorCode::kProtocolError);
  EXPECT_EQ(sum_gathered(s, all, 2, n, out.data()).code(), ErrorCode::kProtocolError);
  // Rank 1's header says version 9.
  auto bad = all;
  bad[(kHeaderBytes + OneBitCodec::bytes_for(n)) + 1] = std::byte{9};
  Status st = sum_gathered(s, bad, 3, n, out.data());
  EXPECT_EQ(st.code(), ErrorCode::kProtocolError);
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  // Another worker's settings: a threshold of 0.25, or 2bit codes.
  st = sum_gathered(Settings{Type::k1Bit, 0.25f}, all, 3, n, out.data());
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("rank 0 sent 1bit(threshold=0.5)"), std::string::npos)
      << st.message();
  EXPECT_NE(sum_gathered(Settings{Type::k2Bit, 0.5f}, all, 3, n, out.data()).code(),
            ErrorCode::kOk);
  for (float v : out)
    ASSERT_EQ(v, 42.0f);
}

}  // namespace
}  // namespace pushpull::compress
