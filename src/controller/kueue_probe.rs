//! The I/O of `--kueue=auto|true` ([`crate::kueue::probe`]): one discovery
//! call for `kueue.x-k8s.io/v1beta2`, then, only when it serves what raygate
//! uses, one SelfSubjectAccessReview per [`probe::checks`] (at most
//! `2 + 7 × MAX_NAMESPACES_CHECKED`, eight at a time), all on a client whose
//! calls are bounded, under one overall deadline.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};

use crate::kueue::probe::{self, Check, Probe};
use crate::kueue::types::{GROUP, VERSION};

/// The probe's whole budget: start-up waits at most this long for it.
pub const DEADLINE: Duration = Duration::from_secs(20);
/// Reviews in flight at once.
const CONCURRENCY: usize = 8;

/// What the API server says; `None` when the probe did not finish within
/// [`DEADLINE`]. `client`'s calls must be bounded (a read timeout).
pub async fn run(client: &Client, namespaces: &[String]) -> Option<Probe> {
    tokio::time::timeout(DEADLINE, gather(client, namespaces))
        .await
        .ok()
}

async fn gather(client: &Client, namespaces: &[String]) -> Probe {
    let served = match client
        .list_api_group_resources(&format!("{GROUP}/{VERSION}"))
        .await
    {
        Ok(list) => Ok(Some(
            list.resources
                .into_iter()
                .map(|r| r.name)
                .collect::<Vec<_>>(),
        )),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e.to_string()),
    };
    let serves_all = matches!(&served, Ok(Some(names))
        if probe::RESOURCES.iter().all(|r| names.iter().any(|n| n == r)));
    if !serves_all {
        // The decision does not need the reviews: no calls for them.
        return Probe {
            served,
            access: vec![],
        };
    }
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let access = futures::stream::iter(probe::checks(namespaces))
        .map(|c| {
            let reviews = reviews.clone();
            async move {
                let answer = review(&reviews, &c).await;
                (c, answer)
            }
        })
        .buffered(CONCURRENCY)
        .collect()
        .await;
    Probe { served, access }
}

async fn review(reviews: &Api<SelfSubjectAccessReview>, c: &Check) -> Result<bool, String> {
    let ssar = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(GROUP.into()),
                resource: Some(c.resource.into()),
                subresource: c.subresource.map(Into::into),
                verb: Some(c.verb.into()),
                namespace: c.namespace.clone(),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let status = reviews
        .create(&PostParams::default(), &ssar)
        .await
        .map_err(|e| e.to_string())?
        .status;
    Ok(status.is_some_and(|s| s.allowed))
}
