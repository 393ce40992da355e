// ember-train's data: the built-in data sets and image folders, with their transforms.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ember/data/dataset.h>
#include <ember/data/text.h>
#include <ember/data/transforms.h>

#include "train_options.h"

namespace ember::apps {

struct DataSplits {
  std::string name;
  std::shared_ptr<const data::Dataset> train, test;
  int64_t classes = 10, channels = 3;
  std::vector<float> mean, std;
  int64_t image_size = 32;
  // Image folders only: the images' sizes vary, so both splits resize to image_size first.
  bool resize = false;
  // Image folders with --bad-images skip: the files left out, "path: reason".
  std::vector<std::string> bad_files;
  // Text (--dataset text): the tokens' vocabulary (classes is its size) and the corpus length.
  std::shared_ptr<const data::TextVocabulary> vocabulary;
  int64_t tokens = 0;
};

// The data set options.dataset names ("text": load_text_data in gpt_setup.h). "folder":
// options.data/train/CLASS/* and options.data/val/CLASS/* (classes by sorted folder name, as
// torchvision's ImageFolder; both splits must hold the same classes), decoded as RGB (a file that
// does not decode fails the run, or with --bad-images skip is left out and listed in bad_files),
// normalised with --mean/--std or with statistics measured once over the training split
// (measure_mean_std).
DataSplits load_data(const TrainOptions& options);

// Training: none for text; for images (for folders: shorter side resized to image_size,) random
// crop image_size square padded by image_size / 8, horizontal flip, to [C, H, W] f32 in [0, 1],
// normalised.
std::shared_ptr<const data::Transform> train_transform(const DataSplits& d);
// Evaluation: none for text; for images (for folders: resized, then the centre square,) to
// tensor, normalised.
std::shared_ptr<const data::Transform> test_transform(const DataSplits& d);

// Per-channel mean and standard deviation of `dataset`'s images after `transform` (which
// must give [C, H, W] f32), over every pixel of every image, read with `workers` threads.
void measure_mean_std(std::shared_ptr<const data::Dataset> dataset,
                      std::shared_ptr<const data::Transform> transform, int workers,
                      std::vector<float>& mean, std::vector<float>& std);

}  // namespace ember::apps
