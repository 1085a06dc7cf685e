#include "loom/parallel/mesh.h"

namespace loom::parallel {

Mesh::Mesh(const comm::Group& world, const MeshShape& shape) : world_(world), shape_(shape) {
  shape_.check_world_size(world.size());
  coord_ = shape_.coord(world.rank());
  for (Dim d : {Dim::pp, Dim::dp, Dim::ep, Dim::tp}) {
    if (shape_.size(d) == world.size()) {
      groups_[size_t(d)] = world;  // the whole world: no split needed
      continue;
    }
    groups_[size_t(d)] = world.split(int(shape_.group_color(world.rank(), d)), int(coord_[d]), dim_name(d));
  }
  if (shape_.size(Dim::ep) == 1) {
    data_ = groups_[size_t(Dim::dp)];
  } else if (data_size() == world.size()) {
    // Ranks must sit in data_index() order (the batch shards follow it); the world's order is
    // the mesh order, which may nest ep outside dp.
    data_ = world.split(0, int(data_index()), "data");
  } else {
    data_ = world.split(int(coord_.pp * shape_.size(Dim::tp) + coord_.tp), int(data_index()), "data");
  }
}

}  // namespace loom::parallel
