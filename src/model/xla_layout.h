// How a step program of the decoder on XLA is laid out over the device mesh (xla/mesh.h's rules table
// applied from outside the model, as torchtitan's parallelize step): the layouts of the program's arguments
// and results, and the constraints inside it (activations in the tokens' layout, weights gathered where they
// are used, the scanned layers' stacked values).
#pragma once
#include <string>

#include "model/layer_pass.h"
#include "xla/hlo_builder.h"
#include "xla/mesh.h"

namespace olmosft::model {

// How an argument or result splits over the mesh: a batch array (its first dimension: tokens in the mesh's
// blocked order, or row tiles), a parameter (or its gradient, moments: xla::param_sharding), or replicated.
enum class Split { kReplicated, kTokens, kRowTiles, kParam };
std::string layout(const xla::Mesh& m, const xla::TensorType& t, Split s);

// The constraints of a step over MESH (identities on one device; GATHER an identity when parameters are
// not split).
PassLayout mesh_layout(xla::HloBuilder& b, const xla::Mesh& mesh);

}  // namespace olmosft::model
