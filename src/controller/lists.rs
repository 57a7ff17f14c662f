//! How every cache fetches its initial state: a streaming list (Kubernetes
//! `WatchList`: one watch with `sendInitialEvents=true`, served from the
//! apiserver's watch cache) where the apiserver serves it, else paginated lists.
//!
//! Why: at 5,000 nodes / 150,000 pods the paginated start-up is 300 pages of
//! 500 pods fetched one after another, each a quorum read (47.9 s to ready,
//! docs/performance.md), and a page is held whole while it is decoded. A
//! streaming list is one request whose objects arrive and are slimmed one at a
//! time. kube-rs' watcher supports both but does not fall back: on an apiserver
//! whose `WatchList` feature gate is off (beta, on by default since v1.32) the
//! streaming watch is refused, or (before v1.27) never sends the end marker, and
//! the cache would never sync. So raygate asks once at start-up ([`probe`]) and
//! decides with [`resolve`]. Readiness means the same in both modes: every
//! cache saw its `InitDone` (the end-of-initial-events bookmark when streaming).

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{WatchEvent, WatchParams};
use kube::runtime::watcher;

/// `--initial-lists`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InitialListsArg {
    /// Stream where the apiserver serves it (asked once at start-up), else paginate.
    #[default]
    #[value(name = "auto")]
    Auto,
    /// Always stream (fails to sync on an apiserver without `WatchList`).
    #[value(name = "streaming")]
    Streaming,
    /// Always paginated lists (500 objects a page), as before streaming lists.
    #[value(name = "paginated")]
    Paginated,
}

/// How the caches fetch their initial state, decided once at start-up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InitialLists {
    Streaming,
    /// kube-rs' default: paginated lists, then a watch.
    #[default]
    Paginated,
}

impl InitialLists {
    /// The watcher configuration every cache starts from.
    pub fn config(self) -> watcher::Config {
        match self {
            InitialLists::Streaming => watcher::Config::default().streaming_lists(),
            InitialLists::Paginated => watcher::Config::default(),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            InitialLists::Streaming => "streaming",
            InitialLists::Paginated => "paginated",
        }
    }
}

/// What the apiserver did with one streaming watch that matches no object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// It sent the `k8s.io/initial-events-end` bookmark: it serves streaming lists.
    Served,
    /// It refused the watch (e.g. 422 "sendInitialEvents is forbidden ... unless
    /// the WatchList feature gate is enabled").
    Refused(String),
    /// It accepted the watch but sent no end marker in time (an apiserver older
    /// than v1.27 ignores `sendInitialEvents`).
    NoEndMarker,
}

/// The mode for `arg` given what the probe found (`None`: not asked, because
/// `arg` is not `auto`), and why, for the start-up log line.
pub fn resolve(arg: InitialListsArg, probe: Option<&Probe>) -> (InitialLists, String) {
    match (arg, probe) {
        (InitialListsArg::Streaming, _) => {
            (InitialLists::Streaming, "--initial-lists=streaming".into())
        }
        (InitialListsArg::Paginated, _) => {
            (InitialLists::Paginated, "--initial-lists=paginated".into())
        }
        (InitialListsArg::Auto, Some(Probe::Served)) => (
            InitialLists::Streaming,
            "the apiserver serves streaming lists (WatchList)".into(),
        ),
        (InitialListsArg::Auto, Some(Probe::Refused(e))) => (
            InitialLists::Paginated,
            format!("the apiserver refused a streaming list ({e})"),
        ),
        (InitialListsArg::Auto, Some(Probe::NoEndMarker)) => (
            InitialLists::Paginated,
            "the apiserver sent no end of initial events (it predates WatchList)".into(),
        ),
        (InitialListsArg::Auto, None) => (
            InitialLists::Paginated,
            "streaming lists were not probed".into(),
        ),
    }
}

/// A label no object carries: the probe's initial events are none, so only
/// the end marker is expected (Nodes: raygate may watch them cluster-wide).
const PROBE_SELECTOR: &str = "raygate.io/initial-lists-probe=never-set";

/// Asks the apiserver once for a streaming list of no Node; bounded by `within`.
pub async fn probe(client: &kube::Client, within: Duration) -> Probe {
    let api = Api::<Node>::all(client.clone());
    let wp = WatchParams {
        label_selector: Some(PROBE_SELECTOR.into()),
        timeout: Some(within.as_secs().max(1) as u32),
        bookmarks: true,
        send_initial_events: true,
        ..WatchParams::default()
    };
    let asked = async {
        let stream = match api.watch(&wp, "0").await {
            Ok(s) => s,
            Err(e) => return Probe::Refused(e.to_string()),
        };
        let mut stream = stream.boxed();
        loop {
            match stream.try_next().await {
                Ok(Some(WatchEvent::Bookmark(b)))
                    if b.metadata
                        .annotations
                        .contains_key("k8s.io/initial-events-end") =>
                {
                    return Probe::Served;
                }
                Ok(Some(WatchEvent::Error(e))) => return Probe::Refused(e.message),
                Ok(Some(_)) => {}
                Ok(None) => return Probe::NoEndMarker,
                Err(e) => return Probe::Refused(e.to_string()),
            }
        }
    };
    tokio::time::timeout(within, asked)
        .await
        .unwrap_or(Probe::NoEndMarker)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_streams_only_where_the_apiserver_sent_the_end_marker() {
        let (m, why) = resolve(InitialListsArg::Auto, Some(&Probe::Served));
        assert_eq!(m, InitialLists::Streaming, "{why}");
        let refused = Probe::Refused("sendInitialEvents is forbidden".into());
        let (m, why) = resolve(InitialListsArg::Auto, Some(&refused));
        assert_eq!(m, InitialLists::Paginated);
        assert!(why.contains("sendInitialEvents is forbidden"), "{why}");
        let (m, _) = resolve(InitialListsArg::Auto, Some(&Probe::NoEndMarker));
        assert_eq!(m, InitialLists::Paginated);
        assert_eq!(
            resolve(InitialListsArg::Auto, None).0,
            InitialLists::Paginated
        );
    }

    #[test]
    fn an_explicit_mode_wins_over_the_probe() {
        let refused = Probe::Refused("no".into());
        assert_eq!(
            resolve(InitialListsArg::Streaming, Some(&refused)).0,
            InitialLists::Streaming
        );
        assert_eq!(
            resolve(InitialListsArg::Paginated, Some(&Probe::Served)).0,
            InitialLists::Paginated
        );
    }

    #[test]
    fn streaming_sets_kube_rs_streaming_strategy() {
        use kube::runtime::watcher::InitialListStrategy;
        assert_eq!(
            InitialLists::Streaming.config().initial_list_strategy,
            InitialListStrategy::StreamingList
        );
        assert_eq!(InitialLists::Paginated.config(), watcher::Config::default());
    }
}
