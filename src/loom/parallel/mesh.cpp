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
    groups_[size_t(d)] = world.split(int(shape_.group_color(world.rank(), d)), int(coord_[d]),
                                     dim_name(d));
  }
}

}  // namespace loom::parallel
