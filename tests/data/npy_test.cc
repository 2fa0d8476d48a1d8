// .npy reading and writing. Files are hand-crafted byte by byte the way
// numpy's format module writes them (data/test_files.h), plus one
// malformed file per rule the reader enforces; each must fail with a
// one-line FileError naming the file and the rule.
#include "data/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "data/test_files.h"

namespace epmoe {
namespace {

using testing::numpy_file_bytes;
using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;

template <typename T>
std::string raw_bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

// Runs `read`, which must throw FileError with a one-line message holding
// every one of `fragments`.
void expect_file_error(const std::function<void()>& read, std::initializer_list<std::string> fragments) {
  try {
    read();
    ADD_FAILURE() << "no FileError";
  } catch (const FileError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos) << "message: " << message << "\nmissing: " << fragment;
    }
  }
}

TEST(Npy, RoundTripsEveryDtypeAndShape) {
  ScratchDir dir;
  const std::vector<Shape> shapes = {{}, {5}, {0}, {2, 3}, {3, 0, 4}, {2, 3, 4}, {1, 1, 1, 7}};
  for (DType dtype : {DType::f32, DType::i32, DType::i64}) {
    for (const Shape& shape : shapes) {
      Tensor original(dtype, shape);
      auto* bytes = static_cast<unsigned char*>(original.raw());
      for (std::int64_t i = 0; i < original.size_bytes(); ++i) bytes[i] = static_cast<unsigned char>(i * 37 + 11);
      const auto path = dir / "array.npy";
      write_npy(path, original);
      const Tensor loaded = read_npy(path, dtype);
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + shape_to_string(shape));
      EXPECT_EQ(loaded.dtype(), dtype);
      EXPECT_EQ(loaded.shape(), shape);
      ASSERT_EQ(loaded.size_bytes(), original.size_bytes());
      if (original.size_bytes() > 0) {  // empty tensors hold no buffer (raw() is null)
        EXPECT_EQ(std::memcmp(loaded.raw(), original.raw(), static_cast<std::size_t>(original.size_bytes())), 0);
      }
    }
  }
}

TEST(Npy, WritesTheBytesNumpyWrites) {
  ScratchDir dir;
  Tensor tensor(DType::f32, {2, 3});
  for (int i = 0; i < 6; ++i) tensor.data<float>()[i] = 0.5f * static_cast<float>(i);
  write_npy(dir / "x.npy", tensor);
  const std::string expected = numpy_file_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                                                raw_bytes(std::vector<float>{0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 2.5f}));
  EXPECT_EQ(read_bytes(dir / "x.npy"), expected);
  EXPECT_EQ((expected.size() - 24) % 64, 0u);  // data starts 64-byte aligned

  Tensor vector(DType::i32, {4});
  write_npy(dir / "ids.npy", vector);
  EXPECT_NE(read_bytes(dir / "ids.npy").find("'shape': (4,), }"), std::string::npos);
}

TEST(Npy, ReadsNumpyVersion1And2And3Headers) {
  ScratchDir dir;
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  for (int version : {1, 2, 3}) {
    const auto path = dir / (std::string("v") + std::to_string(version) + ".npy");
    write_bytes(path, numpy_file_bytes(version, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                                       raw_bytes(values)));
    const Tensor tensor = read_npy(path, DType::f32);
    EXPECT_EQ(tensor.shape(), (Shape{2, 3})) << "version " << version;
    EXPECT_EQ(tensor.data<float>()[5], 6.0f);
    EXPECT_EQ(read_npy_header(path).major_version, version);
  }
}

TEST(Npy, AcceptsAnyKeyOrderAndNumpysGrowthPadding) {
  ScratchDir dir;
  const auto path = dir / "ids.npy";
  // numpy >= 1.23 pads the dict with extra spaces so a file can grow in place.
  write_bytes(path, numpy_file_bytes(1, "{'shape': (3,), 'descr': '<i8', 'fortran_order': False}                      ",
                                     raw_bytes(std::vector<std::int64_t>{7, -8, 9})));
  const Tensor ids = read_npy(path, DType::i64);
  EXPECT_EQ(ids.shape(), (Shape{3}));
  EXPECT_EQ(ids.data<std::int64_t>()[1], -8);
}

TEST(Npy, FortranOrderIsFineForOneDimension) {
  ScratchDir dir;
  const auto path = dir / "bias.npy";
  write_bytes(path, numpy_file_bytes(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }",
                                     raw_bytes(std::vector<float>{1, 2})));
  EXPECT_EQ(read_npy(path, DType::f32).shape(), (Shape{2}));
}

TEST(NpyErrors, MissingFile) {
  ScratchDir dir;
  expect_file_error([&] { read_npy(dir / "x.npy", DType::f32); }, {"x.npy: no such file"});
}

// Inputs are regular files only. A FIFO used to block the open until a
// writer came (forever); the test holds a read-write end open so the old
// code would not hang here but fail on the size instead.
TEST(NpyErrors, FifoIsRefusedWithoutBlocking) {
  ScratchDir dir;
  ASSERT_EQ(::mkfifo((dir / "x.npy").c_str(), 0644), 0);
  const int keep_open = ::open((dir / "x.npy").c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_GE(keep_open, 0);
  expect_file_error([&] { read_npy(dir / "x.npy", DType::f32); }, {"x.npy: not a regular file"});
  ::close(keep_open);
}

// /dev/zero opens and reads fine but has no size; it used to escape as a
// std::filesystem error ("internal error", exit 1).
TEST(NpyErrors, DeviceIsRefused) {
  ScratchDir dir;
  std::filesystem::create_symlink("/dev/zero", dir / "x.npy");
  expect_file_error([&] { read_npy(dir / "x.npy", DType::f32); }, {"x.npy: not a regular file"});
  expect_file_error([] { read_npy_header("/dev/zero"); }, {"/dev/zero: not a regular file"});
}

TEST(NpyErrors, ZeroByteFile) {
  ScratchDir dir;
  write_bytes(dir / "x.npy", "");
  expect_file_error([&] { read_npy(dir / "x.npy", DType::f32); }, {"x.npy: not an .npy file"});
}

TEST(NpyErrors, BadMagic) {
  ScratchDir dir;
  write_bytes(dir / "x.npy", "PK\x03\x04 this is a zip file, as np.savez writes");
  expect_file_error([&] { read_npy(dir / "x.npy", DType::f32); }, {"x.npy: ", "bad magic"});
  write_bytes(dir / "empty.npy", "");
  expect_file_error([&] { read_npy(dir / "empty.npy", DType::f32); }, {"empty.npy: ", "bad magic"});
}

TEST(NpyErrors, TruncatedHeader) {
  ScratchDir dir;
  const std::string whole = numpy_file_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", "");
  write_bytes(dir / "x.npy", whole.substr(0, 40));
  expect_file_error([&] { read_npy(dir / "x.npy", DType::f32); }, {"x.npy: truncated header"});
  write_bytes(dir / "y.npy", whole.substr(0, 9));
  expect_file_error([&] { read_npy(dir / "y.npy", DType::f32); }, {"y.npy: truncated header"});
}

TEST(NpyErrors, TruncatedData) {
  ScratchDir dir;
  write_bytes(dir / "x.npy", numpy_file_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }",
                                              std::string(40, '\0')));
  expect_file_error([&] { read_npy(dir / "x.npy", DType::f32); },
                    {"x.npy: data holds 40 bytes, shape [4, 3] float32 needs 48"});
}

TEST(NpyErrors, TrailingData) {
  ScratchDir dir;
  write_bytes(dir / "x.npy",
              numpy_file_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", std::string(12, '\0')));
  expect_file_error([&] { read_npy(dir / "x.npy", DType::f32); },
                    {"x.npy: data holds 12 bytes, shape [2] float32 needs 8"});
}

TEST(NpyErrors, WrongDtypeSaysHowToConvert) {
  ScratchDir dir;
  write_bytes(dir / "x.npy",
              numpy_file_bytes(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", std::string(16, '\0')));
  expect_file_error([&] { read_npy(dir / "x.npy", DType::f32); },
                    {"x.npy: dtype '<f8' (float64); epmoe reads float32 '<f4'", "x.astype(np.float32)"});
  // int32 ids read where int64 is expected: the dtype is reported, not the size.
  write_bytes(dir / "ids.npy",
              numpy_file_bytes(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", std::string(8, '\0')));
  expect_file_error([&] { read_npy(dir / "ids.npy", DType::i64); },
                    {"ids.npy: dtype '<i4' (int32); epmoe reads int64 '<i8'"});
}

TEST(NpyErrors, StructuredDtype) {
  ScratchDir dir;
  write_bytes(dir / "x.npy", numpy_file_bytes(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }",
                                              std::string(8, '\0')));
  expect_file_error([&] { read_npy(dir / "x.npy", DType::f32); }, {"x.npy: ", "structured dtype"});
}

TEST(NpyErrors, FortranOrder) {
  ScratchDir dir;
  write_bytes(dir / "x.npy",
              numpy_file_bytes(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", std::string(24, '\0')));
  expect_file_error([&] { read_npy(dir / "x.npy", DType::f32); },
                    {"x.npy: fortran_order is True; epmoe reads C-order arrays", "np.ascontiguousarray(x)"});
}

TEST(NpyErrors, BigEndian) {
  ScratchDir dir;
  write_bytes(dir / "x.npy",
              numpy_file_bytes(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", std::string(8, '\0')));
  expect_file_error([&] { read_npy(dir / "x.npy", DType::f32); },
                    {"x.npy: dtype '>f4' is big-endian", "x.astype('<f4')"});
}

TEST(NpyErrors, MalformedDictAndUnknownVersion) {
  ScratchDir dir;
  write_bytes(dir / "x.npy", numpy_file_bytes(1, "{'descr': '<f4', 'shape': (2,), }", std::string(8, '\0')));
  expect_file_error([&] { read_npy(dir / "x.npy", DType::f32); }, {"x.npy: malformed .npy header", "'fortran_order'"});
  write_bytes(dir / "y.npy", numpy_file_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", ""));
  expect_file_error([&] { read_npy(dir / "y.npy", DType::f32); }, {"y.npy: malformed .npy header"});
  write_bytes(dir / "z.npy",
              numpy_file_bytes(4, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", std::string(8, '\0')));
  expect_file_error([&] { read_npy(dir / "z.npy", DType::f32); }, {"z.npy: .npy format version 4.0"});
}

TEST(NpyErrors, WrongShapeNamesBothShapesAndTheirSource) {
  ScratchDir dir;
  write_npy(dir / "wi0.npy", Tensor::zeros(DType::f32, {4, 8, 6}));
  const ExpectedShape expected{{4, 8, 5}, {"E", "H", "F"}, "gate.npy and x.npy"};
  expect_file_error([&] { read_npy(dir / "wi0.npy", DType::f32, expected); },
                    {"wi0.npy: shape [4, 8, 6], expected [4, 8, 5] (E, H, F) from gate.npy and x.npy"});
  const ExpectedShape wrong_rank{{ExpectedShape::kAnyDim, ExpectedShape::kAnyDim}, {"N", "H"}, ""};
  expect_file_error([&] { read_npy(dir / "wi0.npy", DType::f32, wrong_rank); },
                    {"wi0.npy: shape [4, 8, 6], expected [N, H]"});
}

TEST(NpyShape, FreeDimsMatchAnything) {
  const ExpectedShape expected{{4, 8, ExpectedShape::kAnyDim}, {"E", "H", "F"}, "gate.npy"};
  EXPECT_TRUE(expected.matches({4, 8, 1}));
  EXPECT_TRUE(expected.matches({4, 8, 0}));
  EXPECT_FALSE(expected.matches({4, 9, 1}));
  EXPECT_FALSE(expected.matches({4, 8}));
  EXPECT_EQ(expected.to_string(), "[4, 8, F] (E, H, F) from gate.npy");
}

TEST(NpyWrite, ReplacesAtomicallyAndLeavesNoTemporaries) {
  ScratchDir dir;
  write_npy(dir / "y.npy", Tensor::zeros(DType::f32, {3}));
  write_npy(dir / "y.npy", Tensor::zeros(DType::i32, {5}));
  EXPECT_EQ(read_npy(dir / "y.npy", DType::i32).shape(), (Shape{5}));
  int num_entries = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir.path())) ++num_entries;
  EXPECT_EQ(num_entries, 1);
}

TEST(NpyWrite, FailsCleanlyIntoAMissingDirectory) {
  ScratchDir dir;
  expect_file_error([&] { write_npy(dir / "missing" / "y.npy", Tensor::zeros(DType::f32, {3})); },
                    {"y.npy: cannot create a file in"});
  EXPECT_FALSE(std::filesystem::exists(dir / "missing"));
}

TEST(NpyWrite, RefusesDtypesNumpyCannotHold) {
  ScratchDir dir;
  expect_file_error([&] { write_npy(dir / "w.npy", Tensor::zeros(DType::bf16, {3})); }, {"w.npy: ", "not bf16"});
  EXPECT_FALSE(std::filesystem::exists(dir / "w.npy"));
}

}  // namespace
}  // namespace epmoe
