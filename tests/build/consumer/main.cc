// Uses the installed public headers and libraries: encodes and decodes one small tensor.
#include <strait/codec.h>

#include <cstdio>
#include <vector>

int main() {
  std::vector<float> in(1000);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) * 0.5f;
  strait::CodecOptions opt;
  opt.codec = strait::CodecId::kZstd;
  strait::Encoder enc;
  std::vector<uint8_t> frame;
  strait::Status s = enc.Encode(in.data(), in.size(), strait::DataType::kFloat32, opt, &frame);
  if (!s.ok()) return std::fprintf(stderr, "encode: %s\n", s.ToString().c_str()), 1;
  std::vector<float> out(in.size());
  strait::Decoder dec;
  s = dec.Decode(frame, out.data(), out.size(), strait::DataType::kFloat32);
  if (!s.ok() || out != in) return std::fprintf(stderr, "decode: %s\n", s.ToString().c_str()), 1;
  std::printf("consumer: installed strait::codec round-tripped %zu floats in %zu bytes\n",
              in.size(), frame.size());
  return 0;
}
