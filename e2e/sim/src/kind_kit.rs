//! The kind kit's files (`e2e/kind/`), held to what the sim cluster runs (its driver, StorageClasses,
//! node plugin and writer, the images `build-images.sh` makes) and to what keeps podha's agent
//! off the host's kernel there (each node's BMC on the host, `crate::kind_bmc`). `make
//! chaos-kind` runs the kit itself.

use serde_json::Value;

const KIND_CONFIG: &str = include_str!("../../kind/kind-config.yaml");
const CSIDRIVER: &str = include_str!("../../kind/podha-csi/csidriver.yaml");
const STORAGECLASS: &str = include_str!("../../kind/podha-csi/storageclass.yaml");
const CONTROLLER: &str = include_str!("../../kind/podha-csi/controller.yaml");
const POLICY: &str = include_str!("../../kind/policy.yaml");
const PODHA_VALUES: &str = include_str!("../../kind/podha-values.yaml");
const WRITER: &str = include_str!("../../kind/writer.yaml");
const BUILD_IMAGES: &str = include_str!("../../kind/build-images.sh");
const VERSIONS: &str = include_str!("../../versions.mk");

fn docs(yaml: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_norway::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|d| !d.is_null())
        .collect()
}

fn every_manifest() -> Vec<Value> {
    [
        crate::cluster::realnode::csi::NODE_MANIFEST,
        CSIDRIVER,
        STORAGECLASS,
        CONTROLLER,
        POLICY,
        WRITER,
    ]
    .iter()
    .flat_map(|y| docs(y))
    .collect()
}

fn pod_specs(objects: &[Value]) -> Vec<&Value> {
    objects
        .iter()
        .filter_map(|o| {
            o["spec"]["template"]["spec"]
                .as_object()
                .map(|_| &o["spec"]["template"]["spec"])
        })
        .collect()
}

fn version(key: &str) -> String {
    VERSIONS
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .trim_start()
                .strip_prefix(":=")
                .map(str::trim)
        })
        .unwrap()
        .to_string()
}

#[test]
fn every_image_is_one_build_images_makes_at_the_pinned_version() {
    let objects = every_manifest();
    let images: Vec<&str> = pod_specs(&objects)
        .iter()
        .flat_map(|s| s["containers"].as_array().unwrap())
        .map(|c| c["image"].as_str().unwrap())
        .collect();
    assert!(images.len() >= 5, "{images:?}");
    let csi = crate::cluster::realnode::csi::csi_image().unwrap();
    for image in &images {
        let (name, tag) = image.split_once(':').unwrap();
        let short = name
            .strip_prefix("podha.io/")
            .unwrap_or_else(|| panic!("{image}"));
        assert!(
            BUILD_IMAGES.contains(short),
            "build-images.sh builds no {short}"
        );
        match short {
            "podha-csi" => assert_eq!(*image, csi, "podha-csi's image differs from node.yaml's"),
            "csi-attacher" => assert_eq!(tag, format!("v{}", version("CSI_ATTACHER_VERSION"))),
            "csi-provisioner" => {
                assert_eq!(tag, format!("v{}", version("CSI_PROVISIONER_VERSION")))
            }
            other => panic!("unexpected image {other}"),
        }
    }
}

#[test]
fn the_driver_and_storage_classes_are_the_sims() {
    let sim = crate::csi::cluster_objects();
    let kit: Vec<Value> = docs(CSIDRIVER)
        .into_iter()
        .chain(docs(STORAGECLASS))
        .collect();
    let driver = &kit[0];
    let sim_driver = sim
        .iter()
        .find(|o| o["kind"] == "CSIDriver" && o["metadata"]["name"] == driver["metadata"]["name"])
        .expect("the sim serves the kit's driver");
    assert_eq!(driver["metadata"]["name"], crate::csi::RWO_DRIVER);
    assert_eq!(driver["spec"], sim_driver["spec"]);
    for class in kit.iter().filter(|o| o["kind"] == "StorageClass") {
        let name = &class["metadata"]["name"];
        let sim_class = sim
            .iter()
            .find(|o| o["kind"] == "StorageClass" && &o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("the sim has no StorageClass {name}"));
        for field in [
            "provisioner",
            "parameters",
            "reclaimPolicy",
            "volumeBindingMode",
        ] {
            assert_eq!(class[field], sim_class[field], "{name}: {field}");
        }
    }
}

#[test]
fn every_host_path_is_the_kubelets_or_the_shared_directory_every_node_mounts() {
    let config = &docs(KIND_CONFIG)[0];
    let nodes = config["nodes"].as_array().unwrap();
    assert_eq!(nodes.iter().filter(|n| n["role"] == "worker").count(), 3);
    let shared: Vec<&str> = nodes
        .iter()
        .map(|n| n["extraMounts"][0]["containerPath"].as_str().unwrap())
        .collect();
    assert_eq!(nodes.len(), 4);
    assert!(
        shared.iter().all(|p| *p == "/var/lib/podha-csi"),
        "{shared:?}"
    );
    let objects = every_manifest();
    for spec in pod_specs(&objects) {
        for volume in spec["volumes"].as_array().into_iter().flatten() {
            if let Some(path) = volume["hostPath"]["path"].as_str() {
                assert!(
                    path == crate::cluster::realnode::csi::KUBELET_ROOT
                        || path.starts_with("/var/lib/podha-csi/"),
                    "{path} is neither the kubelet's directory nor the shared one"
                );
            }
        }
    }
    assert!(crate::cluster::realnode::csi::CSI_STORE.starts_with("/var/lib/podha-csi/"));
    assert!(crate::cluster::realnode::csi::CSI_ACKS.starts_with("/var/lib/podha-csi/"));
}

#[test]
fn the_kits_writer_is_the_one_the_sims_tests_run() {
    let kit = &docs(WRITER)[0]["spec"]["template"]["spec"]["containers"][0];
    let sim = crate::csi::workload::writer_statefulset("writer", &["n"], "sim-rwo").unwrap();
    let sim = &sim["spec"]["template"]["spec"]["containers"][0];
    for field in ["image", "args", "env", "volumeMounts"] {
        assert_eq!(kit[field], sim[field], "writer {field}");
    }
    let policy = &docs(POLICY)[0]["spec"];
    assert_eq!(policy["volumes"]["drivers"][0], crate::csi::RWO_DRIVER);
}

#[test]
fn every_node_has_a_bmc_of_its_own_named_after_its_container() {
    let config = &docs(KIND_CONFIG)[0];
    let cluster = config["name"].as_str().unwrap();
    // kind names a node's container after the cluster and its role, workers numbered from 2.
    let mut workers = 0;
    for node in config["nodes"].as_array().unwrap() {
        let container = match node["role"].as_str().unwrap() {
            "control-plane" => format!("{cluster}-control-plane"),
            _ => {
                workers += 1;
                match workers {
                    1 => format!("{cluster}-worker"),
                    n => format!("{cluster}-worker{n}"),
                }
            }
        };
        let bmc = &node["extraMounts"][1];
        assert_eq!(bmc["containerPath"], "/podha-bmc", "{container}");
        assert_eq!(
            bmc["hostPath"].as_str().unwrap(),
            format!("/tmp/podha-kind-bmc/{container}"),
            "chaos-kind.sh starts a BMC for each node named in these paths"
        );
    }
}

#[test]
fn the_kits_agent_fences_and_pets_only_through_its_bmc_with_timings_the_agent_takes() {
    let values = &docs(PODHA_VALUES)[0];
    let agent = &values["agent"];
    assert_eq!(agent["enabled"], true);
    assert!(
        crate::chart_install::machine_guard::agent_on_this_machine_is_safe(
            agent,
            &crate::chart_install::machine_guard::StandIns {
                bmc_dir: "/podha-bmc/",
                pods_cgroup: None,
                host_dirs: &["/podha-bmc", "/run/podha-machine"],
            }
        ),
        "{agent}"
    );
    // The options the chart gives the agent from these values, checked as the agent checks them.
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        agent: podha::agent::AgentArgs,
    }
    let text = |v: &Value| v.as_str().unwrap().to_string();
    let mut argv = vec![
        "agent".to_string(),
        "--node=n".into(),
        "--hearing-file=/run/podha-agent/heard".into(),
        format!("--fence={}", text(&agent["fence"])),
        format!("--isolation-timeout={}", text(&agent["isolationTimeout"])),
        format!("--survey-timeout={}", text(&agent["surveyTimeout"])),
        format!("--watchdog={}", text(&agent["watchdog"]["device"])),
        format!("--watchdog-timeout={}", text(&agent["watchdog"]["timeout"])),
    ];
    argv.extend(agent["extraArgs"].as_array().unwrap().iter().map(text));
    let cli = <Cli as clap::Parser>::try_parse_from(&argv).unwrap();
    cli.agent.check().unwrap();
    // The boot ID the node image gives each start of a node, which the Node reports too.
    assert!(argv.contains(&"--boot-id-file=/run/podha-machine/boot_id".to_string()));
    let policy = &docs(POLICY)[0]["spec"]["fencing"];
    assert_eq!(policy["proof"], "Agent");
}
