// parallel::Mesh: the rank grid and the communication group of every dimension, built once
// from the world group and passed to whatever needs a group (ARCHITECTURE.md, invariant 4).
#pragma once
#include "loom/comm/group.h"
#include "loom/parallel/mesh_shape.h"

namespace loom::parallel {

class Mesh {
 public:
  // Collective over `world`: splits it into the pp, dp, ep and tp groups. Throws naming the
  // arithmetic when world.size() != pp * dp * ep * tp.
  Mesh(const comm::Group& world, const MeshShape& shape);

  const MeshShape& shape() const { return shape_; }
  const MeshCoord& coord() const { return coord_; }
  int rank() const { return world_.rank(); }
  const comm::Group& world() const { return world_; }
  const comm::Group& group(Dim d) const { return groups_[size_t(d)]; }
  const comm::Group& dp() const { return group(Dim::dp); }
  const comm::Group& tp() const { return group(Dim::tp); }
  const comm::Group& pp() const { return group(Dim::pp); }
  const comm::Group& ep() const { return group(Dim::ep); }
  // All the ranks that see different data: the dp x ep ranks sharing this rank's pp and tp
  // coordinates, ordered by data_index(). Dense parameters are data-parallel over it; a MoE
  // block's experts over dp() (the ranks holding the same experts). dp() itself when ep = 1.
  const comm::Group& data() const { return data_; }
  int64_t data_size() const { return shape_.size(Dim::dp) * shape_.size(Dim::ep); }
  int64_t data_index() const { return coord_.dp * shape_.size(Dim::ep) + coord_.ep; }

 private:
  comm::Group world_;
  MeshShape shape_;
  MeshCoord coord_;
  std::array<comm::Group, 4> groups_;
  comm::Group data_;
};

}  // namespace loom::parallel
