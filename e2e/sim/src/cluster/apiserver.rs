//! The API server: started at boot, and the outages the tests make of it — a hang (SIGSTOP:
//! its port accepts connections, nothing answers) and a stop (killed: connections refused),
//! each ended as it would end in a cluster (SIGCONT; a restart with the same flags and data).

use super::*;

impl Cluster {
    /// Starts kube-apiserver with the cluster's flags (a running one is killed first).
    pub(in crate::cluster) fn spawn_apiserver(&self) -> Result<()> {
        let pki = pki::Pki::paths(&self.dir);
        let audit_policy = audit::write_policy(&self.dir)?;
        let mut st = self.lock();
        let p = st.ports.clone();
        let mut cmd = Self::bin(&st, "kube-apiserver");
        // With real nodes the `kubernetes` Service's endpoint is the bridge's host address,
        // which the DNAT sends to 127.0.0.1: in-cluster clients on real nodes reach the API
        // server through the Service (kube-proxy); the lease reconciler keeps the endpoint.
        // Without them it cannot have one: a loopback endpoint is invalid, and nothing
        // reaches the API server through the Service.
        let (advertise, reconciler) = match &st.real_nodes {
            Some(real) => (realnode::net::host_ip(real.subnet), "lease"),
            None => (Ipv4Addr::LOCALHOST, "none"),
        };
        cmd.arg(format!("--etcd-servers=http://127.0.0.1:{}", p.etcd_client))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--advertise-address={advertise}"))
            .arg(format!("--endpoint-reconciler-type={reconciler}"))
            .arg(format!("--secure-port={}", p.apiserver))
            .arg(format!("--tls-cert-file={}", pki.serving_cert.display()))
            .arg(format!(
                "--tls-private-key-file={}",
                pki.serving_key.display()
            ))
            .arg(format!("--client-ca-file={}", pki.ca_cert.display()))
            .arg(format!("--token-auth-file={}", pki.tokens.display()))
            .arg("--authorization-mode=Node,RBAC")
            // Real nodes' hostnames resolve nowhere: reach kubelets (logs, exec, port-forward)
            // by address, with a certificate of the CA they trust.
            .arg("--kubelet-preferred-address-types=InternalIP,Hostname")
            .arg(format!(
                "--kubelet-client-certificate={}",
                pki.kubelet_client_cert.display()
            ))
            .arg(format!(
                "--kubelet-client-key={}",
                pki.kubelet_client_key.display()
            ))
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg(format!(
                "--service-account-key-file={}",
                pki.sa_pub.display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                pki.sa_key.display()
            ))
            .arg("--service-cluster-ip-range=10.96.0.0/16")
            .arg("--allow-privileged=true")
            .arg(format!("--audit-policy-file={}", audit_policy.display()))
            .arg(format!(
                "--audit-log-path={}",
                audit::log_path(&self.dir).display()
            ))
            .arg("--audit-log-format=json")
            .args(st.profile.apiserver_args());
        self.spawn(&mut st, APISERVER, cmd)
    }

    /// Waits (up to 180 s) until the API server's `/readyz` says `ok`.
    pub(in crate::cluster) async fn wait_apiserver_ready(
        &self,
        client: &kube::Client,
    ) -> Result<()> {
        self.wait_until(
            "kube-apiserver /readyz",
            Duration::from_secs(180),
            &[ETCD, APISERVER],
            || async move {
                let req = http::Request::get("/readyz").body(Vec::new());
                match req {
                    Ok(req) => Ok(client
                        .request_text(req)
                        .await
                        .is_ok_and(|body| body == "ok")),
                    Err(e) => Err(Error::Other(format!("build /readyz request: {e}"))),
                }
            },
        )
        .await
    }

    /// The API server hangs (`paused`: SIGSTOP; its port still accepts connections, nothing
    /// answers) or goes on (SIGCONT): a control-plane outage as every client sees one.
    pub fn pause_apiserver(&self, paused: bool) -> Result<()> {
        let st = self.lock_reloaded();
        let rec = st
            .processes
            .get(APISERVER)
            .copied()
            .ok_or_else(|| Error::Other("the cluster runs no kube-apiserver".into()))?;
        process::pause(APISERVER, &rec, paused)?;
        info!(paused, "kube-apiserver");
        Ok(())
    }

    /// The API server stops (SIGKILL: every connection reset, new ones refused) until
    /// [`Cluster::start_apiserver`].
    pub fn stop_apiserver(&self) -> Result<()> {
        let mut st = self.lock_reloaded();
        let rec = st
            .processes
            .remove(APISERVER)
            .ok_or_else(|| Error::Other("the cluster runs no kube-apiserver".into()))?;
        process::kill(APISERVER, &rec)?;
        st.save(&self.dir)?;
        info!("kube-apiserver stopped");
        Ok(())
    }

    /// Starts the API server again (same flags, same etcd) and waits until it is ready.
    pub async fn start_apiserver(&self) -> Result<()> {
        self.spawn_apiserver()?;
        let client = self.client().await?;
        self.wait_apiserver_ready(&client).await?;
        info!("kube-apiserver started again");
        Ok(())
    }
}
