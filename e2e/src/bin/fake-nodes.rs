//! fake-nodes: create, delete and list kubelet-less Nodes for the e2e control plane.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use raygate_e2e::fake_node::{FakeNode, Taint, delete_nodes};
use raygate_e2e::sim::names::FAKE_NODE_LABEL;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(about = "Fake (kubelet-less) nodes for raygate's e2e control plane")]
struct Args {
    /// Kubeconfig file (default: KUBECONFIG or ~/.kube/config).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create NAME (or NAME-0..NAME-{N-1} with --count N).
    Create {
        name: String,
        #[arg(long)]
        count: Option<u32>,
        #[arg(long, default_value = "32")]
        cpu: String,
        #[arg(long, default_value = "256Gi")]
        memory: String,
        #[arg(long, default_value_t = 0)]
        gpu: u32,
        #[arg(long, default_value = "nvidia.com/gpu")]
        gpu_resource: String,
        #[arg(long, default_value_t = 110)]
        pods: u32,
        /// k=v, repeatable.
        #[arg(long = "label")]
        labels: Vec<String>,
        /// k=v:Effect, repeatable.
        #[arg(long = "taint")]
        taints: Vec<String>,
    },
    /// Delete nodes by name.
    Delete { names: Vec<String> },
    /// List fake nodes.
    List,
}

async fn client(kubeconfig: Option<PathBuf>) -> Result<Client> {
    let config = match kubeconfig {
        Some(p) => {
            let kc = Kubeconfig::read_from(&p).with_context(|| format!("read {}", p.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?
        }
        None => Config::infer().await?,
    };
    Ok(Client::try_from(config)?)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let client = client(args.kubeconfig).await?;
    match args.cmd {
        Cmd::Create {
            name,
            count,
            cpu,
            memory,
            gpu,
            gpu_resource,
            pods,
            labels,
            taints,
        } => {
            let mut node = FakeNode::new(&name)
                .cpu(cpu)
                .memory(memory)
                .gpu(gpu)
                .gpu_resource(gpu_resource)
                .pods(pods);
            for l in labels {
                let (k, v) = l
                    .split_once('=')
                    .with_context(|| format!("label {l:?} must be k=v"))?;
                node = node.label(k, v);
            }
            for t in taints {
                node = node.taint(Taint::parse(&t)?);
            }
            let names: Vec<String> = match count {
                None => vec![name.clone()],
                Some(n) => (0..n).map(|i| format!("{name}-{i}")).collect(),
            };
            for n in names {
                node.renamed(&n).create(&client).await?;
                println!("node/{n} created");
            }
        }
        Cmd::Delete { names } => {
            delete_nodes(&client, &names).await?;
            for n in names {
                println!("node/{n} deleted");
            }
        }
        Cmd::List => {
            let api: Api<Node> = Api::all(client);
            let lp = ListParams::default().labels(&format!("{FAKE_NODE_LABEL}=true"));
            println!(
                "{:<30} {:>6} {:>10} {:>5} {:>6} TAINTS",
                "NAME", "CPU", "MEMORY", "GPU", "READY"
            );
            for n in api.list(&lp).await? {
                let v = serde_json::to_value(&n)?;
                let alloc = &v["status"]["allocatable"];
                let gpu = alloc
                    .as_object()
                    .and_then(|m| {
                        m.iter()
                            .find(|(k, _)| k.ends_with("gpu"))
                            .map(|(_, v)| v.as_str().unwrap_or("").to_string())
                    })
                    .unwrap_or_else(|| "0".into());
                let ready = v["status"]["conditions"]
                    .as_array()
                    .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                    .and_then(|c| c["status"].as_str())
                    .unwrap_or("Unknown")
                    .to_string();
                let taints: Vec<String> = v["spec"]["taints"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|t| {
                                format!(
                                    "{}={}:{}",
                                    t["key"].as_str().unwrap_or(""),
                                    t["value"].as_str().unwrap_or(""),
                                    t["effect"].as_str().unwrap_or("")
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                println!(
                    "{:<30} {:>6} {:>10} {:>5} {:>6} {}",
                    v["metadata"]["name"].as_str().unwrap_or(""),
                    alloc["cpu"].as_str().unwrap_or(""),
                    alloc["memory"].as_str().unwrap_or(""),
                    gpu,
                    ready,
                    taints.join(",")
                );
            }
        }
    }
    Ok(())
}
