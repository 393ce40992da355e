// A safetensors file read by hand, as Python's safetensors reads it and independently of
// ember's reader: the 8-byte header length, the JSON header, a tensor's raw bytes.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace ember::dist::testing {

struct RawSafetensors {
  std::string path;
  uint64_t length = 0;
  nlohmann::json header;

  explicit RawSafetensors(std::string file) : path(std::move(file)) {
    std::ifstream in(path, std::ios::binary);
    in.read(reinterpret_cast<char*>(&length), 8);
    EXPECT_EQ(length % 8, 0u) << "the data of " << path << " starts unaligned";
    std::string text(length, '\0');
    in.read(text.data(), static_cast<std::streamsize>(length));
    header = nlohmann::json::parse(text);
  }

  // The values of F32 tensor `name`, from its data_offsets.
  std::vector<float> floats(const std::string& name) const {
    const auto offsets = header.at(name).at("data_offsets").get<std::vector<uint64_t>>();
    std::vector<float> values((offsets[1] - offsets[0]) / 4);
    std::ifstream in(path, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(8 + length + offsets[0]));
    in.read(reinterpret_cast<char*>(values.data()),
            static_cast<std::streamsize>(values.size() * 4));
    return values;
  }
};

}  // namespace ember::dist::testing
