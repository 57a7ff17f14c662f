//! raygate's end-to-end harness: a KubeRay stand-in (`kuberay-sim`), fake nodes, and
//! helpers to run tests against a real local control plane (see `e2e/SIMULATION.md`).

pub mod bins;
pub mod control_plane;
pub mod fake_node;
pub mod json;
pub mod process;
pub mod quantity;
pub mod ray_head;
pub mod raygate;
pub mod sim;
pub mod wait;

pub use bins::workspace_bin;
pub use control_plane::{ControlPlane, create_namespace};
pub use fake_node::{FakeNode, Taint};
pub use process::{InProcessSim, KubeRaySim, KubeRaySimOptions};
pub use raygate::Raygate;
pub use wait::{Check, wait_for};
