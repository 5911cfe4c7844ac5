#include "hvd/types.h"

#include <sstream>

namespace hvd {

size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kUInt8: case DataType::kInt8: case DataType::kBool: return 1;
    case DataType::kFloat16: case DataType::kBFloat16: return 2;
    case DataType::kInt16: case DataType::kUInt16: return 2;
    case DataType::kInt32: case DataType::kFloat32: return 4;
    case DataType::kInt64: case DataType::kFloat64: return 8;
  }
  return 0;
}

namespace {
const char* const kTypeNames[kNumDataTypes] = {"uint8",   "int8",  "int32",  "int64",
                                               "float16", "bfloat16", "float32", "float64",
                                               "bool",    "int16", "uint16"};
const char* const kOpNames[kNumReduceOps] = {"sum", "average", "min", "max", "product", "adasum"};
}  // namespace

const char* DataTypeName(DataType t) {
  auto i = static_cast<int>(t);
  return i < kNumDataTypes ? kTypeNames[i] : "unknown";
}

const char* ReduceOpName(ReduceOp op) {
  auto i = static_cast<int>(op);
  return i < kNumReduceOps ? kOpNames[i] : "unknown";
}

bool ParseDataType(const std::string& s, DataType* out) {
  for (int i = 0; i < kNumDataTypes; ++i) {
    if (s == kTypeNames[i]) {
      *out = static_cast<DataType>(i);
      return true;
    }
  }
  // Common aliases.
  if (s == "float" || s == "f32") { *out = DataType::kFloat32; return true; }
  if (s == "double" || s == "f64") { *out = DataType::kFloat64; return true; }
  if (s == "half" || s == "f16") { *out = DataType::kFloat16; return true; }
  if (s == "bf16") { *out = DataType::kBFloat16; return true; }
  if (s == "int") { *out = DataType::kInt32; return true; }
  return false;
}

bool ParseReduceOp(const std::string& s, ReduceOp* out) {
  for (int i = 0; i < kNumReduceOps; ++i) {
    if (s == kOpNames[i]) {
      *out = static_cast<ReduceOp>(i);
      return true;
    }
  }
  if (s == "avg" || s == "mean") { *out = ReduceOp::kAverage; return true; }
  if (s == "prod") { *out = ReduceOp::kProduct; return true; }
  return false;
}

int64_t TensorView::num_elements() const { return NumElements(shape); }

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

std::string TensorView::ShapeString() const { return ShapeToString(shape); }

}  // namespace hvd
