//! sim-csi: a CSI driver that lives only in the API server (provisioner, attacher, node agent).
