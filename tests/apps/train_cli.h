// What the ember-train tests share: a generated image folder (two classes of small PNG and
// BMP images), running the program, its output captured, and parsing its command line.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "data/formats.h"
#include "train_options.h"

namespace ember::apps::testing {

// class 0 reddish, class 1 bluish, with noise; sizes vary so resizing is exercised.
inline bool write_image(const std::filesystem::path& path, int label, int width, int height,
                        std::mt19937& rng) {
  data::testing::Bytes pixels(static_cast<size_t>(width * height * 3));
  std::uniform_int_distribution<int> noise(0, 60);
  for (size_t i = 0; i < pixels.size(); i += 3) {
    pixels[i] = static_cast<unsigned char>((label == 0 ? 180 : 30) + noise(rng));
    pixels[i + 1] = static_cast<unsigned char>(80 + noise(rng));
    pixels[i + 2] = static_cast<unsigned char>((label == 0 ? 30 : 180) + noise(rng));
  }
  const data::testing::Bytes file = path.extension() == ".png"
                                        ? data::testing::png(width, height, 3, pixels)
                                        : data::testing::bmp(width, height, pixels);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size()));
  return static_cast<bool>(out);
}

// root/train/{cat,dog}/imgN.png|bmp (train_per_class each) and root/val/... (val_per_class).
// False when an image could not be written.
inline bool make_image_folder(const std::filesystem::path& root, int train_per_class,
                              int val_per_class) {
  std::mt19937 rng(1);
  for (const auto& [split, per_class] :
       {std::pair{"train", train_per_class}, std::pair{"val", val_per_class}}) {
    for (int label = 0; label < 2; ++label) {
      const std::filesystem::path dir = root / split / (label == 0 ? "cat" : "dog");
      std::filesystem::create_directories(dir);
      for (int i = 0; i < per_class; ++i) {
        const char* ext = i % 2 == 0 ? ".png" : ".bmp";
        if (!write_image(dir / ("img" + std::to_string(i) + ext), label, 20 + i % 5, 18 + i % 3,
                         rng))
          return false;
      }
    }
  }
  return true;
}

struct Result {
  int code;  // the exit status, or -1 when the command did not exit normally
  std::string output;
};
// Runs a shell command, stdout and stderr together.
inline Result run(const std::string& command) {
  Result r{-1, ""};
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  while (fgets(buffer, sizeof buffer, pipe) != nullptr) r.output += buffer;
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline int64_t count_lines_with(const std::filesystem::path& path, const std::string& text) {
  std::ifstream in(path);
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(text) != std::string::npos;
  return n;
}

// parse_train_options on "ember-train" followed by `args`: its return value.
inline int parse_args(std::vector<std::string> args, TrainOptions& options) {
  args.insert(args.begin(), "ember-train");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return parse_train_options(static_cast<int>(argv.size()), argv.data(), options);
}

}  // namespace ember::apps::testing
