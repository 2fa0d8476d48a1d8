#include "core/tensor.h"

#include <cstring>
#include <sstream>
#include <utility>

#include "core/buffer_cache.h"
#include "core/memory_ledger.h"

namespace epmoe {

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t numel = 1;
  for (std::int64_t d : shape) {
    EPMOE_CHECK_GE(d, 0);
    numel *= d;
  }
  return numel;
}

std::string shape_to_string(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

Tensor::Tensor(DType dtype, Shape shape, MemoryLedger* ledger, std::string ledger_name)
    : dtype_(dtype),
      shape_(std::move(shape)),
      numel_(shape_numel(shape_)),
      ledger_(ledger),
      ledger_name_(std::move(ledger_name)) {
  const BufferBlock block = acquire_buffer(static_cast<std::size_t>(size_bytes()));
  data_ = block.data;
  capacity_bytes_ = block.capacity_bytes;
  if (ledger_ != nullptr) ledger_->on_allocate(ledger_name_, size_bytes());
}

Tensor Tensor::zeros(DType dtype, Shape shape, MemoryLedger* ledger, std::string ledger_name) {
  Tensor tensor(dtype, std::move(shape), ledger, std::move(ledger_name));
  tensor.fill_zero();
  return tensor;
}

Tensor::Tensor(Tensor&& other) noexcept
    : dtype_(other.dtype_),
      shape_(std::move(other.shape_)),
      numel_(std::exchange(other.numel_, 0)),
      data_(std::exchange(other.data_, nullptr)),
      capacity_bytes_(std::exchange(other.capacity_bytes_, 0)),
      ledger_(std::exchange(other.ledger_, nullptr)),
      ledger_name_(std::move(other.ledger_name_)) {
  other.shape_.clear();
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    release();
    dtype_ = other.dtype_;
    shape_ = std::move(other.shape_);
    other.shape_.clear();
    numel_ = std::exchange(other.numel_, 0);
    data_ = std::exchange(other.data_, nullptr);
    capacity_bytes_ = std::exchange(other.capacity_bytes_, 0);
    ledger_ = std::exchange(other.ledger_, nullptr);
    ledger_name_ = std::move(other.ledger_name_);
  }
  return *this;
}

Tensor::~Tensor() { release(); }

void Tensor::release() noexcept {
  if (ledger_ != nullptr) {
    try {
      ledger_->on_release(ledger_name_, size_bytes());
    } catch (...) {
      // Destructors never throw; a ledger mismatch is caught by ledger tests.
    }
    ledger_ = nullptr;
  }
  release_buffer(data_, capacity_bytes_);
  data_ = nullptr;
  capacity_bytes_ = 0;
  numel_ = 0;
}

Tensor Tensor::clone() const {
  Tensor copy(dtype_, shape_);
  if (size_bytes() > 0) std::memcpy(copy.data_, data_, static_cast<std::size_t>(size_bytes()));
  return copy;
}

void Tensor::fill_zero() {
  if (size_bytes() > 0) std::memset(data_, 0, static_cast<std::size_t>(size_bytes()));
}

std::int64_t Tensor::dim(int i) const {
  const int n = rank();
  const int index = i < 0 ? i + n : i;
  EPMOE_CHECK(index >= 0 && index < n);
  return shape_[static_cast<std::size_t>(index)];
}

void Tensor::attribute_to(MemoryLedger* ledger, std::string name) {
  EPMOE_CHECK(ledger_ == nullptr);
  if (ledger == nullptr) return;
  ledger_ = ledger;
  ledger_name_ = std::move(name);
  ledger_->on_allocate(ledger_name_, size_bytes());
}

void Tensor::reshape(Shape shape) {
  EPMOE_CHECK_EQ(shape_numel(shape), numel_);
  shape_ = std::move(shape);
}

}  // namespace epmoe
