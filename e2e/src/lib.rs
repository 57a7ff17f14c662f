//! raygate's end-to-end harness: helpers to run tests against a real local control plane
//! (Kubernetes v1.36, kwok nodes, the real KubeRay operator and `ray-head`, the Ray stand-in;
//! see `e2e/README.md`).

pub mod apis;
pub mod bins;
pub mod control_plane;
pub mod dra;
pub mod fake_node;
pub mod faults;
pub mod fixtures;
pub mod json;
pub mod ray_head;
pub mod raygate;
pub mod seeded;
pub mod wait;

pub use bins::workspace_bin;
pub use control_plane::{ControlPlane, KubeRay, Options, create_namespace, rand_suffix};
pub use fake_node::{FakeNode, Taint};
pub use fixtures::GpuRayService;
pub use raygate::{Raygate, Spawn, older_raygate};
pub use wait::{Check, wait_for};
