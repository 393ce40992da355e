#include "data_setup.h"

#include <cmath>
#include <filesystem>

#include <ember/data/dataloader.h>
#include <ember/data/datasets.h>
#include <ember/tensor/error.h>

#include "gpt_setup.h"

namespace fs = std::filesystem;

namespace ember::apps {

namespace {
using Transforms = std::vector<std::shared_ptr<const data::Transform>>;

// Resize (folders) then the centre square, to tensor: the evaluation view, unnormalised.
Transforms eval_view(const DataSplits& d) {
  Transforms t;
  if (d.resize) {
    t.push_back(std::make_shared<data::Resize>(d.image_size));
    t.push_back(std::make_shared<data::CenterCrop>(d.image_size, d.image_size));
  }
  t.push_back(std::make_shared<data::ToTensor>());
  return t;
}

void load_folder(const TrainOptions& o, DataSplits& d) {
  const fs::path root(o.data);
  for (const char* split : {"train", "val"}) {
    EMBER_CHECK(fs::is_directory(root / split), "ember-train --dataset folder", "'",
                (root / split).string(), "' is not a folder (want ", o.data,
                "/train/CLASS/*.png|jpg and ", o.data, "/val/CLASS/...)");
  }
  const data::ImageFolderOptions folder_options{.skip_bad_files = o.bad_images == "skip"};
  auto train = std::make_shared<data::ImageFolder>((root / "train").string(), folder_options);
  auto val = std::make_shared<data::ImageFolder>((root / "val").string(), folder_options);
  for (const auto* split : {train.get(), val.get()}) {
    for (const auto& bad : split->bad_files()) d.bad_files.push_back(bad.path + ": " + bad.reason);
  }
  EMBER_CHECK(train->classes() == val->classes(), "ember-train --dataset folder", "train/ holds ",
              train->classes().size(), " classes and val/ ", val->classes().size(),
              ": both need the same class folders");
  d.train = train;
  d.test = val;
  d.classes = static_cast<int64_t>(train->classes().size());
  d.channels = 3;
  d.image_size = o.image_size;
  d.resize = true;
  if (!o.mean.empty()) {
    d.mean.assign(o.mean.begin(), o.mean.end());
    d.std.assign(o.std.begin(), o.std.end());
  } else {
    measure_mean_std(d.train, std::make_shared<data::Compose>(eval_view(d)), o.workers, d.mean,
                     d.std);
  }
}
}  // namespace

DataSplits load_data(const TrainOptions& o) {
  if (o.dataset == "text") return load_text_data(o);
  std::string which = o.dataset;
  if (which == "auto")
    which = fs::exists(fs::path(o.data) / "cifar-10-batches-bin") ? "cifar10" : "fashion-mnist";
  DataSplits d;
  d.name = which;
  if (which == "folder") {
    d.name = "image folder " + o.data;
    load_folder(o, d);
  } else if (which == "cifar10") {
    d.train = std::make_shared<data::Cifar10>(o.data, data::Split::kTrain);
    d.test = std::make_shared<data::Cifar10>(o.data, data::Split::kTest);
    d.mean = {0.4914f, 0.4822f, 0.4465f};
    d.std = {0.2470f, 0.2435f, 0.2616f};
  } else if (which == "cifar100") {
    d.train = std::make_shared<data::Cifar100>(o.data, data::Split::kTrain);
    d.test = std::make_shared<data::Cifar100>(o.data, data::Split::kTest);
    d.classes = 100;
    d.mean = {0.5071f, 0.4865f, 0.4409f};
    d.std = {0.2673f, 0.2564f, 0.2762f};
  } else {
    const bool fashion = which == "fashion-mnist";
    const std::string root =
        o.dataset == "auto" || o.data == "data"
            ? std::string(fashion ? data::FashionMnist::kDefaultRoot : "data/mnist")
            : o.data;
    if (fashion) {
      d.train = std::make_shared<data::FashionMnist>(data::Split::kTrain, root);
      d.test = std::make_shared<data::FashionMnist>(data::Split::kTest, root);
      d.mean = {0.2860f};
      d.std = {0.3530f};
    } else {
      d.train = std::make_shared<data::Mnist>(root, data::Split::kTrain);
      d.test = std::make_shared<data::Mnist>(root, data::Split::kTest);
      d.mean = {0.1307f};
      d.std = {0.3081f};
    }
    d.channels = 1;
    d.image_size = 28;
  }
  return d;
}

std::shared_ptr<const data::Transform> train_transform(const DataSplits& d) {
  if (d.vocabulary != nullptr) return nullptr;  // text windows go to the model as they are
  Transforms t;
  if (d.resize) t.push_back(std::make_shared<data::Resize>(d.image_size));
  t.push_back(std::make_shared<data::RandomCrop>(d.image_size, d.image_size, d.image_size / 8));
  t.push_back(std::make_shared<data::RandomHorizontalFlip>());
  t.push_back(std::make_shared<data::ToTensor>());
  t.push_back(std::make_shared<data::Normalize>(d.mean, d.std));
  return std::make_shared<data::Compose>(std::move(t));
}

std::shared_ptr<const data::Transform> test_transform(const DataSplits& d) {
  if (d.vocabulary != nullptr) return nullptr;
  Transforms t = eval_view(d);
  t.push_back(std::make_shared<data::Normalize>(d.mean, d.std));
  return std::make_shared<data::Compose>(std::move(t));
}

void measure_mean_std(std::shared_ptr<const data::Dataset> dataset,
                      std::shared_ptr<const data::Transform> transform, int workers,
                      std::vector<float>& mean, std::vector<float>& std) {
  data::DataLoaderOptions options;
  options.batch_size = 64;
  options.num_workers = workers;
  options.transform = std::move(transform);
  data::DataLoader loader(std::move(dataset), options);
  std::vector<double> sum, sum_sq;
  double count = 0;
  for (const data::Batch& batch : loader) {
    EMBER_CHECK(batch.data.dim() == 4, "measure_mean_std", "want [B, C, H, W] images, got ",
                batch.data.dim(), " dims");
    const int64_t b = batch.data.size(0), c = batch.data.size(1),
                  hw = batch.data.size(2) * batch.data.size(3);
    if (sum.empty()) sum.assign(static_cast<size_t>(c), 0.0), sum_sq = sum;
    const std::vector<float> v = batch.data.contiguous().to_vector<float>();
    for (int64_t i = 0; i < b; ++i) {
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* p = v.data() + (i * c + ch) * hw;
        double s = 0, s2 = 0;
        for (int64_t k = 0; k < hw; ++k) s += p[k], s2 += static_cast<double>(p[k]) * p[k];
        sum[static_cast<size_t>(ch)] += s;
        sum_sq[static_cast<size_t>(ch)] += s2;
      }
    }
    count += static_cast<double>(b * hw);
  }
  EMBER_CHECK(count > 0, "measure_mean_std", "the data set holds no images");
  mean.clear();
  std.clear();
  for (size_t ch = 0; ch < sum.size(); ++ch) {
    const double m = sum[ch] / count;
    const double var = std::max(sum_sq[ch] / count - m * m, 0.0);
    mean.push_back(static_cast<float>(m));
    // A constant channel would divide by zero; PyTorch users pass std 1 for those.
    std.push_back(static_cast<float>(var > 1e-12 ? std::sqrt(var) : 1.0));
  }
}

}  // namespace ember::apps
