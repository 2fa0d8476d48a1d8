#include "data/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <string_view>
#include <system_error>

#include "core/error.h"
#include "core/file_error.h"
#include "data/atomic_file.h"

namespace epmoe {
namespace {

// Format: 6-byte magic, major and minor version bytes, a little-endian
// header length (2 bytes in 1.0, 4 in 2.0/3.0), then an ASCII (UTF-8 in 3.0)
// Python dict literal padded with spaces to a multiple of 64 bytes and ending
// in '\n', then the array bytes.
constexpr std::string_view kMagic = "\x93NUMPY";
constexpr std::size_t kPrefixBytesV1 = 10;    // magic + version + uint16 length
constexpr std::size_t kPrefixBytesV2 = 12;    // magic + version + uint32 length
constexpr std::size_t kHeaderAlignment = 64;  // numpy's ARRAY_ALIGN

// numpy's names for the type codes of a descr such as '<f8', for messages.
std::string numpy_type_name(std::string_view type_code) {
  static constexpr std::pair<std::string_view, std::string_view> kNames[] = {
      {"f2", "float16"}, {"f4", "float32"},   {"f8", "float64"},     {"f16", "float128"},
      {"i1", "int8"},    {"i2", "int16"},     {"i4", "int32"},       {"i8", "int64"},
      {"u1", "uint8"},   {"u2", "uint16"},    {"u4", "uint32"},      {"u8", "uint64"},
      {"b1", "bool"},    {"c8", "complex64"}, {"c16", "complex128"}, {"O", "object"}};
  for (const auto& [code, name] : kNames) {
    if (code == type_code) return std::string(name);
  }
  return {};
}

std::string numpy_type_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "float32";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
    case DType::bf16:
    case DType::fp8_e4m3:
      break;
  }
  throw InternalError("npy: dtype " + std::string(dtype_name(dtype)) + " has no numpy equivalent");
}

// A name usable in a numpy one-liner: the file's stem when it is a Python
// identifier (x.npy -> x), otherwise "a".
std::string python_variable_for(const std::filesystem::path& path) {
  const std::string stem = path.stem().string();
  bool is_identifier = !stem.empty() && !std::isdigit(static_cast<unsigned char>(stem[0]));
  for (char c : stem) is_identifier &= std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  return is_identifier ? stem : "a";
}

// Parses the header dict numpy writes, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// Only the literal forms numpy produces are accepted (strings, True/False,
// tuples of non-negative ints), in any key order.
class HeaderDictParser {
 public:
  HeaderDictParser(std::string_view text, const std::filesystem::path& path) : text_(text), path_(path) {}

  void parse_into(NpyHeader& header) {
    bool has_descr = false, has_fortran_order = false, has_shape = false;
    expect('{');
    while (!consume('}')) {
      const std::string key = parse_string();
      expect(':');
      if (key == "descr") {
        skip_space();
        if (peek() == '[') malformed("'descr' is a structured dtype; epmoe reads plain arrays");
        header.descr = parse_string();
        has_descr = true;
      } else if (key == "fortran_order") {
        header.fortran_order = parse_bool();
        has_fortran_order = true;
      } else if (key == "shape") {
        header.shape = parse_shape();
        has_shape = true;
      } else {
        malformed("unexpected key '" + key + "'");
      }
      if (!consume(',')) {
        expect('}');
        break;
      }
    }
    if (!has_descr) malformed("no 'descr' key");
    if (!has_fortran_order) malformed("no 'fortran_order' key");
    if (!has_shape) malformed("no 'shape' key");
  }

 private:
  [[noreturn]] void malformed(const std::string& why) {
    throw_file_error(path_, "malformed .npy header (" + why + ")");
  }

  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  char peek() { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool consume(char c) {
    skip_space();
    if (peek() != c) return false;
    ++pos_;
    return true;
  }
  void expect(char c) {
    if (!consume(c)) {
      malformed(std::string("expected '") + c + "' at byte " + std::to_string(pos_) + " of the dict");
    }
  }

  std::string parse_string() {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') {
      malformed("expected a quoted string at byte " + std::to_string(pos_) + " of the dict");
    }
    const std::size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) malformed("unterminated string");
    std::string value(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return value;
  }

  bool parse_bool() {
    skip_space();
    for (const auto& [word, value] :
         {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    malformed("'fortran_order' is neither True nor False");
  }

  Shape parse_shape() {
    Shape shape;
    expect('(');
    while (!consume(')')) {
      skip_space();
      if (!std::isdigit(static_cast<unsigned char>(peek()))) {
        malformed("'shape' holds something other than non-negative integers");
      }
      std::int64_t dim = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        const int digit = text_[pos_++] - '0';
        if (dim > (std::numeric_limits<std::int64_t>::max() - digit) / 10) {
          malformed("a 'shape' dimension overflows int64");
        }
        dim = dim * 10 + digit;
      }
      if (peek() == 'L') ++pos_;  // Python 2 long literal, as old numpy wrote them
      shape.push_back(dim);
      if (!consume(',')) {
        expect(')');
        break;
      }
    }
    return shape;
  }

  std::string_view text_;
  const std::filesystem::path& path_;
  std::size_t pos_ = 0;
};

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

struct OpenedNpy {
  FilePtr file;
  NpyHeader header;
  std::int64_t file_size_bytes = 0;
};

std::uint32_t read_little_endian(const unsigned char* bytes, int num_bytes) {
  std::uint32_t value = 0;
  for (int i = num_bytes - 1; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

OpenedNpy open_npy(const std::filesystem::path& path) {
  std::error_code status_error;
  const auto status = std::filesystem::status(path, status_error);
  if (!std::filesystem::exists(status)) throw_file_error(path, "no such file");
  if (std::filesystem::is_directory(status)) throw_file_error(path, "is a directory, not an .npy file");
  // Only regular files: opening a FIFO blocks until a writer comes (forever),
  // a device such as /dev/zero has no size to check the data against.
  if (!std::filesystem::is_regular_file(status)) {
    throw_file_error(path, "not a regular file (a FIFO, socket or device); an .npy input must be a file");
  }

  OpenedNpy opened;
  // O_NONBLOCK: should a FIFO replace the file between the check and the
  // open, the open returns at once and fstat below refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw_file_error(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat opened_status {};
  if (::fstat(fd, &opened_status) != 0 || !S_ISREG(opened_status.st_mode)) {
    ::close(fd);
    throw_file_error(path, "not a regular file; an .npy input must be a file");
  }
  opened.file.reset(::fdopen(fd, "rb"));
  if (!opened.file) {
    ::close(fd);
    throw_file_error(path, std::string("cannot open: ") + std::strerror(errno));
  }
  opened.file_size_bytes = static_cast<std::int64_t>(opened_status.st_size);

  unsigned char prefix[kPrefixBytesV2] = {};
  const std::size_t prefix_read = std::fread(prefix, 1, sizeof(prefix), opened.file.get());
  const std::size_t magic_compared = std::min(prefix_read, kMagic.size());
  if (magic_compared < kMagic.size() || std::memcmp(prefix, kMagic.data(), kMagic.size()) != 0) {
    throw_file_error(path, "not an .npy file (bad magic: it must start with \\x93NUMPY)");
  }
  if (prefix_read < kPrefixBytesV1) throw_file_error(path, "truncated header (the file ends inside the prefix)");

  NpyHeader& header = opened.header;
  header.major_version = prefix[6];
  std::size_t prefix_bytes = 0;
  std::uint32_t header_bytes = 0;
  if (header.major_version == 1) {
    prefix_bytes = kPrefixBytesV1;
    header_bytes = read_little_endian(prefix + 8, 2);
  } else if (header.major_version == 2 || header.major_version == 3) {
    if (prefix_read < kPrefixBytesV2) throw_file_error(path, "truncated header (the file ends inside the prefix)");
    prefix_bytes = kPrefixBytesV2;
    header_bytes = read_little_endian(prefix + 8, 4);
  } else {
    throw_file_error(path, ".npy format version " + std::to_string(prefix[6]) + "." + std::to_string(prefix[7]) +
                               "; epmoe reads versions 1.0, 2.0 and 3.0");
  }
  header.data_offset_bytes = static_cast<std::int64_t>(prefix_bytes) + header_bytes;
  if (header.data_offset_bytes > opened.file_size_bytes) {
    throw_file_error(path, "truncated header: it declares " + std::to_string(header_bytes) + " bytes, the file holds " +
                               std::to_string(opened.file_size_bytes - static_cast<std::int64_t>(prefix_bytes)) +
                               " after the prefix");
  }

  std::string header_text(header_bytes, '\0');
  std::fseek(opened.file.get(), static_cast<long>(prefix_bytes), SEEK_SET);
  if (std::fread(header_text.data(), 1, header_bytes, opened.file.get()) != header_bytes) {
    throw_file_error(path, std::string("read failed: ") + std::strerror(errno));
  }
  HeaderDictParser(header_text, path).parse_into(header);
  return opened;
}

// Little-endian '<' and native '=' are the same on the machines epmoe runs on
// (x86-64, little-endian); '|' marks byte-order-free one-byte types.
void check_descr(const std::filesystem::path& path, const std::string& descr, DType expected) {
  const std::string expected_descr = npy_descr(expected);
  const std::string_view type_code = descr.empty() ? std::string_view() : std::string_view(descr).substr(1);
  const std::string_view expected_code = std::string_view(expected_descr).substr(1);
  const bool little_or_native = !descr.empty() && (descr[0] == '<' || descr[0] == '=');
  if (little_or_native && type_code == expected_code) return;

  const std::string expected_name = numpy_type_name(expected);
  const std::string variable = python_variable_for(path);
  if (!descr.empty() && descr[0] == '>' && type_code == expected_code) {
    throw_file_error(path, "dtype '" + descr + "' is big-endian; epmoe reads little-endian " + expected_name + " '" +
                               expected_descr + "'; convert with " + variable + ".astype('" + expected_descr + "')");
  }
  const std::string got_name = numpy_type_name(type_code);
  throw_file_error(path, "dtype '" + descr + "'" + (got_name.empty() ? "" : " (" + got_name + ")") + "; epmoe reads " +
                             expected_name + " '" + expected_descr + "'; convert with " + variable + ".astype(np." +
                             expected_name + ")");
}

std::string shape_tuple_text(const Shape& shape) {
  std::string text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(shape[i]);
  }
  if (shape.size() == 1) text += ",";
  return text + ")";
}

// The header decides dtype and shape, so both are checked before the data
// size: a float64 file is reported as float64, not as a size mismatch.
Tensor read_checked_npy(const std::filesystem::path& path, DType expected_dtype, const ExpectedShape* expected_shape) {
  OpenedNpy opened = open_npy(path);
  const NpyHeader& header = opened.header;
  check_descr(path, header.descr, expected_dtype);
  if (expected_shape != nullptr && !expected_shape->matches(header.shape)) {
    throw_file_error(path, "shape " + shape_to_string(header.shape) + ", expected " + expected_shape->to_string());
  }
  // A 0-d or 1-d array is laid out the same in C and Fortran order.
  if (header.fortran_order && header.shape.size() > 1) {
    throw_file_error(path, "fortran_order is True; epmoe reads C-order arrays; save with np.ascontiguousarray(" +
                               python_variable_for(path) + ")");
  }

  const std::int64_t item_bytes = static_cast<std::int64_t>(dtype_size_bytes(expected_dtype));
  std::int64_t needed_bytes = item_bytes;
  for (std::int64_t dim : header.shape) {
    if (__builtin_mul_overflow(needed_bytes, dim, &needed_bytes)) {
      throw_file_error(path, "shape " + shape_to_string(header.shape) + " overflows a 64-bit byte count");
    }
  }
  const std::int64_t held_bytes = opened.file_size_bytes - header.data_offset_bytes;
  if (held_bytes != needed_bytes) {
    throw_file_error(path, "data holds " + std::to_string(held_bytes) + " bytes, shape " +
                               shape_to_string(header.shape) + " " + numpy_type_name(expected_dtype) + " needs " +
                               std::to_string(needed_bytes) +
                               (held_bytes < needed_bytes ? " (truncated file)" : " (trailing bytes)"));
  }

  Tensor tensor(expected_dtype, header.shape);
  std::fseek(opened.file.get(), static_cast<long>(header.data_offset_bytes), SEEK_SET);
  const auto bytes = static_cast<std::size_t>(needed_bytes);
  if (bytes > 0 && std::fread(tensor.raw(), 1, bytes, opened.file.get()) != bytes) {
    throw_file_error(path, std::string("read failed: ") + std::strerror(errno));
  }
  return tensor;
}

}  // namespace

bool ExpectedShape::matches(const Shape& shape) const {
  if (shape.size() != dims.size()) return false;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] != kAnyDim && dims[i] != shape[i]) return false;
  }
  return true;
}

std::string ExpectedShape::to_string() const {
  std::string text = "[";
  bool any_fixed = false;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    text += i ? ", " : "";
    if (dims[i] == kAnyDim) {
      text += i < dim_names.size() ? dim_names[i] : "?";
    } else {
      text += std::to_string(dims[i]);
      any_fixed = true;
    }
  }
  text += "]";
  // The names in parentheses only add information when some dims are numbers.
  if (any_fixed && !dim_names.empty()) {
    text += " (";
    for (std::size_t i = 0; i < dim_names.size(); ++i) text += (i ? ", " : "") + dim_names[i];
    text += ")";
  }
  if (!source.empty()) text += " from " + source;
  return text;
}

std::string npy_descr(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "<f4";
    case DType::i32:
      return "<i4";
    case DType::i64:
      return "<i8";
    case DType::bf16:
    case DType::fp8_e4m3:
      break;
  }
  throw InternalError("npy: dtype " + std::string(dtype_name(dtype)) + " has no numpy equivalent");
}

NpyHeader read_npy_header(const std::filesystem::path& path) { return open_npy(path).header; }

Tensor read_npy(const std::filesystem::path& path, DType expected_dtype) {
  return read_checked_npy(path, expected_dtype, nullptr);
}

Tensor read_npy(const std::filesystem::path& path, DType expected_dtype, const ExpectedShape& expected_shape) {
  return read_checked_npy(path, expected_dtype, &expected_shape);
}

void write_npy(const std::filesystem::path& path, TensorView array) {
  if (array.dtype() != DType::f32 && array.dtype() != DType::i32 && array.dtype() != DType::i64) {
    throw_file_error(path,
                     "epmoe writes float32, int32 and int64 .npy files, not " + std::string(dtype_name(array.dtype())));
  }
  if (!array.is_contiguous()) throw_file_error(path, "the array to write is not C-contiguous");
  std::string header = "{'descr': '" + npy_descr(array.dtype()) + "', 'fortran_order': False, 'shape': " +
                       shape_tuple_text(Shape(array.shape().begin(), array.shape().end())) + ", }";
  // As numpy does: version 1.0 unless the header needs a 4-byte length; pad
  // with spaces so the array bytes start 64-byte aligned; end with '\n'.
  const bool needs_v2 = header.size() + kHeaderAlignment + 1 > std::numeric_limits<std::uint16_t>::max();
  const std::size_t prefix_bytes = needs_v2 ? kPrefixBytesV2 : kPrefixBytesV1;
  const std::size_t unpadded = prefix_bytes + header.size() + 1;
  header.append((kHeaderAlignment - unpadded % kHeaderAlignment) % kHeaderAlignment, ' ');
  header.push_back('\n');

  std::string prefix(kMagic);
  prefix.push_back(static_cast<char>(needs_v2 ? 2 : 1));
  prefix.push_back('\0');
  const std::size_t length_bytes = prefix_bytes - prefix.size();
  for (std::size_t i = 0; i < length_bytes; ++i) {
    prefix.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  }
  const std::string_view data(static_cast<const char*>(array.raw()), static_cast<std::size_t>(array.size_bytes()));
  write_file_atomically(path, {prefix, header, data});
}

}  // namespace epmoe
