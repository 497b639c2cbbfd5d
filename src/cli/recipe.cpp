// `olmosft recipe show RECIPE [key=value ...]`: the fully resolved recipe and its derived values, checked.
// `olmosft recipe keys`: every key with its type, default and meaning: the trainer's table, then the k8s
// launcher's `cluster.*` table.
#include "train/recipe.h"

#include <iostream>

#include "cli/verb.h"
#include "cluster/recipe_keys.h"

namespace {
int recipe_show(int argc, char** argv) {
  CLI::App app{"Print a recipe with every default filled in, and its derived batch/schedule values",
               "recipe show"};
  std::string path;
  std::vector<std::string> overrides;
  app.add_option("recipe", path, "recipe YAML")->required();
  app.add_option("overrides", overrides, "key=value overrides (win over the file)");
  return olmosft::cli::run_app(app, argc, argv, [&] {
    olmosft::Recipe r = olmosft::Recipe::load(path, overrides);
    const olmosft::TrainConfig cfg = r.config();
    std::cout << cfg.resolved_yaml;
    olmosft::print_derived(std::cout, cfg.batch);
    return 0;
  });
}

int recipe_keys(int argc, char** argv) {
  CLI::App app{
      "List every recipe key (the trainer's and the k8s launcher's cluster.*) with its type, default "
      "and meaning",
      "recipe keys"};
  return olmosft::cli::run_app(app, argc, argv, [&] {
    for (const auto& k : olmosft::recipe_keys()) olmosft::print_recipe_key(std::cout, k);
    for (const auto& k : olmosft::cluster::cluster_keys()) olmosft::print_recipe_key(std::cout, k);
    return 0;
  });
}
}  // namespace

OLMOSFT_VERB("recipe show", "print a resolved recipe and its derived batch/schedule values", recipe_show);
OLMOSFT_VERB("recipe keys", "list every recipe key with its type and default", recipe_keys);
