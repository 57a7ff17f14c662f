// Pins the Gateway API release whose CRDs 'e2e/control-plane up --incremental' installs
// (config/crd/standard of the module, as released): KubeRay's RayServiceIncrementalUpgrade
// gate creates a Gateway and an HTTPRoute per RayService and builds no RayCluster without them.
module raygate.dev/e2e-tools/gateway-api

go 1.26

require sigs.k8s.io/gateway-api v1.4.1
