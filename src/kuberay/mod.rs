//! What KubeRay does.
