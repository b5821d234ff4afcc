//! The lab's workloads on real nodes, as YAML a user would apply: per cluster an HTTP server
//! Deployment `web` (busybox httpd; `/cgi-bin/who` answers with the cluster, the pod's own
//! address and the client address it sees) spread over the nodes, its Service, a client pod on
//! the node that does not run the gateway, and the stub zone that sends `clusterset.local`
//! from the cluster DNS (`nk-dns`) to kubetun's DNS, as `deploy/coredns/clusterset.server`
//! does for CoreDNS.

/// The namespace of the lab's workloads.
pub const NAMESPACE: &str = "default";

/// The HTTP server and its Service in cluster `cluster`.
pub fn web(cluster: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {NAMESPACE}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      topologySpreadConstraints:
        - {{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {{matchLabels: {{app: web}}}}}}
      containers:
        - name: web
          image: busybox:1.35.0
          env:
            - {{name: CLUSTER, value: {cluster}}}
            - name: POD_IP
              valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}
          command:
            - sh
            - -c
            - |
              mkdir -p /www/cgi-bin
              printf '#!/bin/sh\necho "Content-Type: text/plain"\necho\necho "$CLUSTER $POD_IP sees $REMOTE_ADDR"\n' > /www/cgi-bin/who
              chmod 755 /www/cgi-bin/who
              exec httpd -f -p 8080 -h /www
          ports: [{{name: http, containerPort: 8080}}]
          readinessProbe: {{tcpSocket: {{port: http}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {NAMESPACE}}}
spec:
  selector: {{app: web}}
  ports: [{{name: http, port: 80, targetPort: http}}]
"#
    )
}

/// The client pod, on `node`.
pub fn client(node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: {NAMESPACE}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
    - {{name: client, image: "busybox:1.35.0", command: [sleep, "86400"]}}
"#
    )
}

/// `ServiceExport` of `web`.
pub fn export() -> String {
    format!(
        "apiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceExport\nmetadata: {{name: web, namespace: {NAMESPACE}}}\n"
    )
}

/// The cluster DNS's stub zone for `clusterset.local` (nk-dns reads it from this ConfigMap).
pub fn clusterset_stub_zone() -> String {
    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: nk-dns, namespace: kube-system}\n\
     data: {forward: clusterset.local kubetun-system/kubetun-dns}\n"
        .to_owned()
}
