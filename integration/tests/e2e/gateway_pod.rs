//! The image and the gateway pod, run the way Kubernetes runs them (rootful podman):
//!
//! 1. a base image is made from scratch with only the files the binaries load (`ldd`), the CA
//!    bundle, `ip` (the gateway runs it for its addresses and routes) and `wg`, and `deploy/Dockerfile` builds the image on it from the binaries of
//!    this build (`BASE=<that image>`, `BINARIES=context`);
//! 2. two Pods are generated from the Deployment in `deploy/gateway.yaml` (same image,
//!    command, arguments, env, ports, security context, `/dev/net/tun` and resources) and
//!    started with `podman kube play` on a podman network the test creates. The changes: only
//!    the `gateway` container runs (its controller needs an API server; the test plays it over
//!    the gRPC socket instead), the socket `emptyDir`s become host directories so the test
//!    reaches the sockets, the `ports` are left out (podman would publish them on the host,
//!    where two pods clash; in Kubernetes they are informational), and the probes are
//!    executed by the test from the host against the pod address exactly as the manifest
//!    states them, as the kubelet does (podman would run them as `curl` inside the
//!    container, and the image has no curl);
//! 3. checked: the process holds no capability but `NET_ADMIN`, the root filesystem is
//!    read-only, `/readyz` fails before the state is applied and passes after, a ping from one
//!    pod's network namespace reaches the other's tunnel address through both gateways,
//!    `/readyz` fails again when the private key is removed over the WireGuard UAPI socket, and
//!    the liveness probe fails while the gateway process is frozen (SIGSTOP) and passes once it
//!    runs again.
//!
//! Pods, network, images and the base container are removed by name when the test ends, also
//! when it fails. Needs root, podman, buildah and nsenter; under CI=true it fails instead of
//! skipping when they are missing.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kubetun_controller::gateway_api::{self, DesiredState};
use kubetun_controller::keys::GatewayKey;
use kubetun_controller::plumbing::gateway_client::GatewayClient;
use kubetun_integration::image;
use kubetun_integration::netns::{bin_path, command_exists, require_root, wait_for_path};
use serde_yaml::Value;

const WG_PORT: u32 = 51820;
const IFNAME: &str = "kubetun0";

fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

fn run_ok(program: &str, args: &[&str]) -> String {
    image::run(program, args).unwrap_or_else(|e| panic!("{e}"))
}

/// Everything the test made, removed by name on drop (also after a failed assertion): the
/// pods and the network first, then the image build's containers and images.
#[derive(Default)]
struct Made {
    pods: Vec<String>,
    network: Option<String>,
    build: image::Artifacts,
}

impl Drop for Made {
    fn drop(&mut self) {
        let quick = Duration::from_secs(60);
        for pod in &self.pods {
            let _ = image::run_bounded(
                "podman",
                &["pod", "rm", "--force", "--time", "2", pod],
                quick,
            );
        }
        if let Some(network) = &self.network {
            let _ = image::run_bounded("podman", &["network", "rm", "--force", network], quick);
        }
    }
}

/// Whether the test can run here; prints why not (and fails under CI).
fn preconditions() -> bool {
    if !require_root("gateway_pod") {
        return false;
    }
    let missing: Vec<&str> = [
        "podman", "buildah", "nsenter", "ping", "ldd", "strip", "timeout",
    ]
    .into_iter()
    .filter(|tool| !command_exists(tool))
    .collect();
    if missing.is_empty() {
        return true;
    }
    let reason = format!("missing {} (.ci/setup installs them)", missing.join(", "));
    assert!(!under_ci(), "gateway_pod cannot run under CI: {reason}");
    eprintln!("SKIPPED gateway_pod: {reason}");
    false
}

/// An HTTP probe as the manifest states it.
#[derive(Debug, Clone)]
struct Probe {
    path: String,
    port: u16,
    timeout: Duration,
}

impl Probe {
    /// Reads `container.<key>.httpGet`, resolving a named port.
    fn from_container(container: &Value, key: &str) -> Probe {
        let probe = &container[key];
        let http = &probe["httpGet"];
        let path = http["path"].as_str().expect("httpGet.path").to_owned();
        let port = match &http["port"] {
            Value::Number(n) => u16::try_from(n.as_u64().expect("port")).expect("port"),
            Value::String(name) => container["ports"]
                .as_sequence()
                .expect("ports")
                .iter()
                .find(|p| p["name"].as_str() == Some(name))
                .and_then(|p| p["containerPort"].as_u64())
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or_else(|| panic!("no container port named {name}")),
            other => panic!("probe port {other:?}"),
        };
        // Kubernetes' default timeoutSeconds is 1.
        let timeout = Duration::from_secs(probe["timeoutSeconds"].as_u64().unwrap_or(1));
        Probe {
            path,
            port,
            timeout,
        }
    }

    /// Whether the probe passes against `ip` (a status 200..400 within the timeout).
    fn passes(&self, ip: &str) -> bool {
        let addr: SocketAddr = format!("{ip}:{}", self.port).parse().expect("address");
        let attempt = || -> std::io::Result<bool> {
            let mut stream = TcpStream::connect_timeout(&addr, self.timeout)?;
            stream.set_read_timeout(Some(self.timeout))?;
            stream.set_write_timeout(Some(self.timeout))?;
            write!(
                stream,
                "GET {} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n",
                self.path
            )?;
            let mut head = [0u8; 12];
            stream.read_exact(&mut head)?;
            let status: u16 = std::str::from_utf8(&head[9..12])
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            Ok((200..400).contains(&status))
        };
        attempt().unwrap_or(false)
    }

    /// Polls until the probe's result is `expected` or `timeout` passes.
    fn wait_for(&self, ip: &str, expected: bool, timeout: Duration) -> bool {
        let start = Instant::now();
        loop {
            if self.passes(ip) == expected {
                return true;
            }
            if start.elapsed() > timeout {
                return false;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The Deployment's pod template and its `gateway` container.
fn deployment_template() -> Value {
    use serde::Deserialize as _;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/gateway.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/gateway.yaml");
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("YAML"))
        .find(|doc| doc["kind"].as_str() == Some("Deployment"))
        .expect("a Deployment in deploy/gateway.yaml")["spec"]["template"]
        .clone()
}

/// Does for the container what the kubelet does and `podman kube play` does not: env values
/// from the ConfigMap (deploy/config.yaml) and `$(NAME)` references in `command` and `args`.
fn resolve_config_refs(container: &mut Value) {
    use serde::Deserialize as _;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/config.yaml");
    let config = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("YAML"))
        .find(|doc| doc["kind"].as_str() == Some("ConfigMap"))
        .expect("a ConfigMap in deploy/config.yaml");
    let Some(env) = container["env"].as_sequence_mut() else {
        return;
    };
    for var in env.iter_mut() {
        let Some(key) = var["valueFrom"]["configMapKeyRef"]["key"].as_str() else {
            continue;
        };
        let value = config["data"][key]
            .as_str()
            .unwrap_or_else(|| panic!("deploy/config.yaml has no {key}"))
            .to_owned();
        let map = var.as_mapping_mut().expect("env entry");
        map.remove("valueFrom");
        map.insert("value".into(), value.into());
    }
    let values: Vec<(String, String)> = env
        .iter()
        .filter_map(|var| {
            Some((
                var["name"].as_str()?.to_owned(),
                var["value"].as_str()?.to_owned(),
            ))
        })
        .collect();
    for field in ["command", "args"] {
        for arg in container[field].as_sequence_mut().into_iter().flatten() {
            if let Some(text) = arg.as_str() {
                let mut expanded = text.to_owned();
                for (name, value) in &values {
                    expanded = expanded.replace(&format!("$({name})"), value);
                }
                *arg = expanded.into();
            }
        }
    }
}

/// One gateway pod made from the Deployment's template.
struct GatewayPod {
    name: String,
    socket_dirs: Vec<(String, PathBuf)>,
    readiness: Probe,
    liveness: Probe,
    ip: String,
    pid: u32,
    key: GatewayKey,
}

impl GatewayPod {
    fn socket_dir(&self, volume: &str) -> &Path {
        &self
            .socket_dirs
            .iter()
            .find(|(name, _)| name == volume)
            .unwrap_or_else(|| panic!("no volume {volume}"))
            .1
    }

    fn grpc_socket(&self) -> PathBuf {
        self.socket_dir("control-socket")
            .join(format!("{IFNAME}.grpc.sock"))
    }

    fn uapi_socket(&self) -> PathBuf {
        self.socket_dir("wireguard-uapi")
            .join(format!("{IFNAME}.sock"))
    }
}

/// Writes the Pod for `name` and plays it on `network`.
fn play_pod(made: &mut Made, work: &Path, name: &str, image: &str, network: &str) -> GatewayPod {
    let pod_name = name;
    let template = deployment_template();
    let mut spec = template["spec"].clone();
    let containers = spec["containers"].as_sequence().expect("containers");
    let mut gateway = containers
        .iter()
        .find(|c| c["name"].as_str() == Some("gateway"))
        .expect("a gateway container")
        .clone();
    let readiness = Probe::from_container(&gateway, "readinessProbe");
    let liveness = Probe::from_container(&gateway, "livenessProbe");
    let mounted: Vec<String> = gateway["volumeMounts"]
        .as_sequence()
        .expect("volumeMounts")
        .iter()
        .filter_map(|m| m["name"].as_str().map(str::to_owned))
        .collect();
    resolve_config_refs(&mut gateway);
    let map = gateway.as_mapping_mut().expect("container");
    map.insert("image".into(), image.into());
    map.remove("readinessProbe");
    map.remove("livenessProbe");
    // Kubernetes' containerPorts are informational; podman publishes them on the host, where
    // the two pods' ports would clash.
    map.remove("ports");

    let spec_map = spec.as_mapping_mut().expect("pod spec");
    spec_map.insert("containers".into(), Value::Sequence(vec![gateway]));
    spec_map.remove("serviceAccountName");
    let mut socket_dirs = Vec::new();
    let volumes: Vec<Value> = spec_map["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .filter(|v| {
            v["name"]
                .as_str()
                .is_some_and(|n| mounted.iter().any(|m| m == n))
        })
        .map(|volume| {
            let name = volume["name"].as_str().expect("volume name").to_owned();
            if volume.get("emptyDir").is_none() {
                return volume.clone();
            }
            let dir = work.join(format!("{pod_name}-{name}"));
            std::fs::create_dir_all(&dir).expect("mkdir");
            let replaced: Value = serde_yaml::from_str(&format!(
                "{{name: {name}, hostPath: {{path: {}, type: Directory}}}}",
                dir.display()
            ))
            .expect("volume");
            socket_dirs.push((name, dir));
            replaced
        })
        .collect();
    spec_map.insert("volumes".into(), Value::Sequence(volumes));

    let mut pod = serde_yaml::Mapping::new();
    pod.insert("apiVersion".into(), "v1".into());
    pod.insert("kind".into(), "Pod".into());
    let mut metadata = serde_yaml::Mapping::new();
    metadata.insert("name".into(), name.into());
    metadata.insert("labels".into(), template["metadata"]["labels"].clone());
    pod.insert("metadata".into(), Value::Mapping(metadata));
    pod.insert("spec".into(), spec);
    let file = work.join(format!("{name}.yaml"));
    std::fs::write(&file, serde_yaml::to_string(&pod).expect("YAML")).expect("write pod");

    made.pods.push(name.to_owned());
    run_ok(
        "podman",
        &[
            "kube",
            "play",
            "--network",
            network,
            &file.to_string_lossy(),
        ],
    );
    let container = format!("{name}-gateway");
    let infra = run_ok(
        "podman",
        &["pod", "inspect", "--format", "{{.InfraContainerID}}", name],
    );
    let ip = run_ok(
        "podman",
        &[
            "inspect",
            "--format",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            &infra,
        ],
    );
    let pid: u32 = run_ok(
        "podman",
        &["inspect", "--format", "{{.State.Pid}}", &container],
    )
    .parse()
    .expect("pid");
    assert!(pid > 0 && !ip.is_empty(), "{name}: pid {pid}, ip {ip:?}");
    GatewayPod {
        name: name.to_owned(),
        socket_dirs,
        readiness,
        liveness,
        ip,
        pid,
        key: GatewayKey::generate(),
    }
}

/// `own`'s state with `peer` as its one peer; `own_net`/`peer_net` are /24 prefixes `a.b.c`.
fn state(own: &GatewayPod, peer: &GatewayPod, own_net: &str, peer_net: &str) -> DesiredState {
    DesiredState {
        version: format!("pod-test-{}", own.name),
        interface: Some(gateway_api::Interface {
            private_key: own.key.private_base64(),
            listen_port: WG_PORT,
            addresses: vec![format!("{own_net}.1/24")],
            manage_routes: true,
            ..Default::default()
        }),
        peers: vec![gateway_api::Peer {
            public_key: peer.key.public_base64().to_owned(),
            name: peer.name.clone(),
            endpoint: format!("{}:{WG_PORT}", peer.ip),
            persistent_keepalive: 1,
            routes: vec![gateway_api::Route {
                real: format!("{peer_net}.0/24"),
                view: String::new(),
                fallback: false,
            }],
            ..Default::default()
        }],
    }
}

/// One UAPI exchange on `socket`; the `errno` the gateway answers.
fn uapi(socket: &Path, request: &str) -> String {
    let mut stream = std::os::unix::net::UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    stream.write_all(request.as_bytes()).expect("write");
    let mut answer = Vec::new();
    let mut buf = [0u8; 256];
    while !answer.ends_with(b"\n\n") {
        let n = stream.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&answer).trim().to_owned()
}

/// Pings `address` from the network namespace of `pid` until one answers or `timeout` passes.
fn ping_from(pid: u32, address: &str, timeout: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        let ok = Command::new("nsenter")
            .args([
                "-t",
                &pid.to_string(),
                "-n",
                "ping",
                "-c",
                "1",
                "-W",
                "1",
                address,
            ])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return true;
        }
    }
    false
}

/// The gateway container's logs and state, for failure messages.
fn describe(pod: &str) -> String {
    let container = format!("{pod}-gateway");
    let state = image::run_bounded(
        "podman",
        &[
            "inspect",
            "--format",
            "{{.State.Status}} exit={{.State.ExitCode}} restarts={{.RestartCount}}",
            &container,
        ],
        Duration::from_secs(30),
    )
    .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    .unwrap_or_else(|e| e);
    let logs = image::run_bounded(
        "podman",
        &["logs", "--tail", "30", &container],
        Duration::from_secs(30),
    )
    .map(|o| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
    .unwrap_or_else(|e| e);
    format!("{container}: {state}\n{logs}")
}

/// Effective capabilities of `pid` (from /proc/<pid>/status).
fn effective_caps(pid: u32, pod: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("process {pid}: {e}; {}", describe(pod)));
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .expect("CapEff")
        .trim();
    u64::from_str_radix(hex, 16).expect("hex")
}

#[test]
fn gateway_pods_from_the_manifest_tunnel_traffic_and_report_health() {
    let _turn = kubetun_integration::netns::turn(module_path!());
    if !preconditions() {
        return;
    }
    let started = Instant::now();
    let tag = format!("t{}", std::process::id());
    let work = tempfile::tempdir().expect("temp dir");
    let mut made = Made::default();

    let binaries: Vec<PathBuf> = ["kubetun-gateway", "kubetun-controller", "kubetun-agent"]
        .into_iter()
        .map(bin_path)
        .collect();
    let base = image::build_base(&mut made.build, work.path(), &binaries, &tag)
        .unwrap_or_else(|e| panic!("{e}"));
    let image = format!("localhost/kubetun-test:{tag}");
    image::build_image(&mut made.build, work.path(), &binaries, &base, &image)
        .unwrap_or_else(|e| panic!("{e}"));
    let size = run_ok(
        "podman",
        &["image", "inspect", "--format", "{{.Size}}", &image],
    );
    println!("image {image}: {size} bytes (debug binaries of this build, stripped)");

    let network = format!("kubetun-test-{tag}");
    made.network = Some(network.clone());
    run_ok("podman", &["network", "create", &network]);
    let a = play_pod(
        &mut made,
        work.path(),
        &format!("kubetun-a-{tag}"),
        &image,
        &network,
    );
    let b = play_pod(
        &mut made,
        work.path(),
        &format!("kubetun-b-{tag}"),
        &image,
        &network,
    );

    for pod in [&a, &b] {
        assert!(
            wait_for_path(&pod.grpc_socket(), Duration::from_secs(20)),
            "{}: no gRPC socket at {} (podman logs {}-gateway)",
            pod.name,
            pod.grpc_socket().display(),
            pod.name
        );
        // The manifest's security context: NET_ADMIN (bit 12) and nothing else.
        assert_eq!(
            effective_caps(pod.pid, &pod.name),
            1 << 12,
            "{}: the gateway holds more than NET_ADMIN",
            pod.name
        );
        let read_only = run_ok(
            "podman",
            &[
                "inspect",
                "--format",
                "{{.HostConfig.ReadonlyRootfs}}",
                &format!("{}-gateway", pod.name),
            ],
        );
        assert_eq!(
            read_only, "true",
            "{}: root filesystem not read-only",
            pod.name
        );
        assert!(
            pod.liveness
                .wait_for(&pod.ip, true, Duration::from_secs(10)),
            "{}: liveness probe {:?} fails on a running gateway",
            pod.name,
            pod.liveness
        );
        assert!(
            !pod.readiness.passes(&pod.ip),
            "{}: ready before any state was applied",
            pod.name
        );
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let apply = |own: &GatewayPod, peer: &GatewayPod, own_net: &str, peer_net: &str| {
        runtime
            .block_on(async {
                let client = GatewayClient::new(own.grpc_socket());
                client.apply(state(own, peer, own_net, peer_net)).await
            })
            .unwrap_or_else(|e| panic!("apply to {}: {e}", own.name));
    };
    apply(&a, &b, "10.231.1", "10.231.2");
    apply(&b, &a, "10.231.2", "10.231.1");
    for pod in [&a, &b] {
        assert!(
            pod.readiness
                .wait_for(&pod.ip, true, Duration::from_secs(10)),
            "{}: not ready after the state was applied",
            pod.name
        );
    }

    // Pod A's network namespace → its gateway → WireGuard over the podman network → pod B's
    // gateway → B's tunnel address, and back.
    let diagnose = |pod: &GatewayPod| {
        let status =
            runtime.block_on(async { GatewayClient::new(pod.grpc_socket()).status().await });
        let netns = |args: &[&str]| {
            Command::new("nsenter")
                .args(["-t", &pod.pid.to_string(), "-n"])
                .args(args)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        format!(
            "{}: status {status:?}\naddresses:\n{}routes:\n{}{}",
            pod.name,
            netns(&["ip", "-br", "addr"]),
            netns(&["ip", "route"]),
            describe(&pod.name)
        )
    };
    assert!(
        ping_from(a.pid, "10.231.2.1", Duration::from_secs(15)),
        "no answer from pod B's tunnel address through the gateways\n{}\n{}",
        diagnose(&a),
        diagnose(&b)
    );
    assert!(ping_from(b.pid, "10.231.1.1", Duration::from_secs(5)));

    // Broken: the private key removed → not ready.
    let zero = "0".repeat(64);
    let errno = uapi(&a.uapi_socket(), &format!("set=1\nprivate_key={zero}\n\n"));
    assert_eq!(errno, "errno=0", "UAPI set on {}", a.name);
    assert!(
        a.readiness.wait_for(&a.ip, false, Duration::from_secs(5)),
        "{}: still ready without a private key",
        a.name
    );
    apply(&a, &b, "10.231.1", "10.231.2");
    assert!(a.readiness.wait_for(&a.ip, true, Duration::from_secs(10)));

    // Broken: the process hangs → the liveness probe fails within its timeout; it passes again
    // once the process runs.
    run_ok("kill", &["-STOP", &b.pid.to_string()]);
    let hung = b.liveness.wait_for(&b.ip, false, Duration::from_secs(10));
    run_ok("kill", &["-CONT", &b.pid.to_string()]);
    assert!(
        hung,
        "{}: liveness probe passes on a frozen gateway",
        b.name
    );
    assert!(
        b.liveness.wait_for(&b.ip, true, Duration::from_secs(10)),
        "{}: liveness probe does not recover",
        b.name
    );
    assert!(ping_from(a.pid, "10.231.2.1", Duration::from_secs(10)));
    println!("gateway pod test took {:?}", started.elapsed());
}
