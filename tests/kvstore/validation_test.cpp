// SPDX-License-Identifier: Apache-2.0
// Bad input: each case gets a clear error and changes nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pushpull/error.h"
#include "pushpull/kvstore.h"

namespace pushpull {
namespace {

using ::testing::HasSubstr;

class ValidationTest : public ::testing::Test {
 protected:
  void SetUp() override { kv->init(std::vector<Key>{1, 2}, {w1, w2}); }
  // The stored values are still the initial ones.
  void expect_unchanged() {
    Array o1({2, 3}, DType::kFloat32), o2({4}, DType::kFloat16);
    kv->pull(std::vector<Key>{1, 2}, std::vector<ArrayView>{o1, o2});
    for (int i = 0; i < 6; ++i)
      EXPECT_EQ(get_element(o1, i), 1.0);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(get_element(o2, i), 2.0);
  }
  template <typename E, typename F>
  std::string expect_error(F&& f) {
    try {
      f();
    } catch (const E& e) {
      expect_unchanged();
      return e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "wrong exception: " << e.what();
      return "";
    }
    ADD_FAILURE() << "no exception";
    return "";
  }

  std::unique_ptr<KVStore> kv = create_kvstore("local");
  Array w1 = Array::full({2, 3}, 1.0), w2 = Array::full({4}, 2.0, DType::kFloat16);
  Array good = Array::full({2, 3}, 5.0);
};

TEST_F(ValidationTest, UninitialisedKey) {
  auto msg = expect_error<NotFound>([&] { kv->push(3, good.view()); });
  EXPECT_THAT(msg, HasSubstr("key 3"));
  EXPECT_THAT(msg, HasSubstr("init"));
  Array o({2, 3}, DType::kFloat32);
  expect_error<NotFound>([&] { kv->pull(3, o.view()); });
  // A batch with one unknown key changes none of its keys.
  expect_error<NotFound>([&] {
    kv->push(std::vector<Key>{1, 3}, std::vector<ArrayView>{good, good});
  });
}

TEST_F(ValidationTest, ShapeMismatchNamesKeyAndShapes) {
  Array bad = Array::full({3, 2}, 5.0);
  auto msg = expect_error<InvalidArgument>([&] { kv->push(1, ArrayList{good, bad}); });
  EXPECT_THAT(msg, HasSubstr("key 1"));
  EXPECT_THAT(msg, HasSubstr("(3, 2)"));
  EXPECT_THAT(msg, HasSubstr("(2, 3)"));
  Array out({6}, DType::kFloat32);
  expect_error<InvalidArgument>([&] { kv->pull(1, out.view()); });
  // The good key of a batch is not pushed either.
  expect_error<InvalidArgument>([&] {
    kv->push(std::vector<Key>{1, 2}, std::vector<ArrayView>{good, bad});
  });
}

TEST_F(ValidationTest, DTypeMismatchNamesBothDTypes) {
  Array bad = Array::full({4}, 5.0, DType::kFloat32);
  auto msg = expect_error<InvalidArgument>([&] { kv->push(2, bad.view()); });
  EXPECT_THAT(msg, HasSubstr("key 2"));
  EXPECT_THAT(msg, HasSubstr("float32"));
  EXPECT_THAT(msg, HasSubstr("float16"));
}

TEST_F(ValidationTest, EmptyLists) {
  EXPECT_THAT(expect_error<InvalidArgument>([&] { kv->push(1, ArrayList{}); }), HasSubstr("empty"));
  expect_error<InvalidArgument>([&] { kv->pull(1, ArrayList{}); });
  expect_error<InvalidArgument>([&] { kv->push(std::vector<Key>{}, std::vector<ArrayList>{}); });
  expect_error<InvalidArgument>([&] { kv->init(std::vector<Key>{}, {}); });
  // Key and list counts differ.
  expect_error<InvalidArgument>([&] {
    kv->push(std::vector<Key>{1, 2}, std::vector<ArrayList>{{good}});
  });
}

TEST_F(ValidationTest, MixedKeyKinds) {
  auto msg = expect_error<InvalidArgument>([&] {
    kv->push(std::vector<Key>{1, "x"}, std::vector<ArrayView>{good, good});
  });
  EXPECT_THAT(msg, HasSubstr("string"));
  // This store holds int keys: a string key is refused even for init.
  expect_error<InvalidArgument>([&] { kv->init("w", good); });
  expect_error<InvalidArgument>([&] { kv->pull("w", good.view()); });
}

TEST_F(ValidationTest, NullArrays) {
  ArrayView null_out(static_cast<float*>(nullptr), {2, 3});
  EXPECT_THAT(expect_error<InvalidArgument>([&] {
                kv->pull(1, ArrayList{good, null_out});
              }),
              HasSubstr("null"));
  expect_error<InvalidArgument>([&] { kv->push(1, null_out); });
  expect_error<InvalidArgument>([&] { kv->init(9, null_out); });
}

TEST_F(ValidationTest, DoubleInit) {
  expect_error<AlreadyExists>([&] { kv->init(1, good); });
  // Twice in one call: neither is stored.
  expect_error<AlreadyExists>([&] { kv->init(std::vector<Key>{5, 5}, {good, good}); });
  Array o({2, 3}, DType::kFloat32);
  EXPECT_THROW(kv->pull(5, o.view()), NotFound);
}

TEST_F(ValidationTest, NonCpuArrays) {
  ArrayView gpu(good.data(), DType::kFloat32, {2, 3}, Device::cuda(0));
  auto msg = expect_error<InvalidArgument>([&] { kv->push(1, ArrayList{good, gpu}); });
  EXPECT_THAT(msg, HasSubstr("cuda(0)"));
  EXPECT_THAT(msg, HasSubstr("not supported yet"));
  expect_error<InvalidArgument>([&] { kv->pull(1, gpu); });
  expect_error<InvalidArgument>([&] { kv->init(8, gpu); });
}

TEST_F(ValidationTest, PushPullChecksOutputsBeforePushing) {
  Array bad_out({2, 2}, DType::kFloat32);
  expect_error<InvalidArgument>([&] { kv->pushpull(1, good, bad_out); });
}

}  // namespace
}  // namespace pushpull
