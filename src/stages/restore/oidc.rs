//! `oidc-issuer`: on the AWS platform, once the restored control plane
//! serves, check that the cluster's OIDC issuer publishes the public half of
//! its service-account signing key (the `sa-signing-key` the backup
//! brought back), and rewrite the issuer's two documents in S3 when they are
//! missing or stale ([`crate::hosted::oidc`]). Moved to another management
//! cluster, a cluster's issuer is often stale: the source's HyperShift
//! deleted the documents, or the destination's wrote them into its own
//! bucket. Without them every component fails with `WebIdentityErr`.
//!
//! The stage never fails the restore on the issuer: documents it cannot
//! write (no rights on the bucket, an issuer that is not an S3 URL) are a
//! warning that says exactly what to grant or check and the command that
//! repairs them afterwards (`hcp-dr cluster oidc --repair`). What IAM must
//! hold is reported, not checked. Nothing to undo: the documents it writes
//! are the cluster's own, the same for the source and for the restored copy.
//! Nothing to do on another platform.

use async_trait::async_trait;

use super::RestoreContext;
use crate::hosted::HOSTED_CLUSTER;
use crate::hosted::oidc::{self, IssuerReport};
use crate::kube::{api, get_json};
use crate::pipeline::{Stage, StageId, StageFailure, Step};
use crate::stages::StageError;
use crate::store::S3Options;

pub struct OidcIssuer;

impl StageId for OidcIssuer {
    const NAME: &'static str = "oidc-issuer";
    /// None: not an AWS cluster.
    type Output = Option<IssuerReport>;
}

#[async_trait]
impl Stage<RestoreContext> for OidcIssuer {
    fn summary(&self) -> &'static str {
        "AWS: check that the cluster's OIDC issuer publishes its service-account key, and rewrite the issuer documents in S3 when they do not"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &RestoreContext, _step: &Step<'_>) -> Vec<String> {
        vec![format!(
            "on the AWS platform: read {}/{} and {} through S3 and rewrite them from Secret {}/{} when they do not publish its key; nothing on other platforms",
            "<spec.issuerURL>",
            oidc::DISCOVERY_PATH,
            oidc::JWKS_PATH,
            ctx.inputs.hcp_namespace(),
            oidc::SIGNING_KEY_SECRET
        )]
    }
    async fn run(&self, ctx: &mut RestoreContext, _step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let (ns, name) = (&ctx.inputs.namespace, &ctx.inputs.hosted_cluster);
        let hc = get_json(&api(&ctx.client, &HOSTED_CLUSTER, ns), name, &ctx.inputs.hc_label())
            .await?
            .ok_or_else(|| StageError::Precondition(format!("{} disappeared after the restore: find out who deleted it", ctx.inputs.hc_label())))?;
        let s3 = S3Options { endpoint: ctx.inputs.s3_endpoint.clone(), ca_bundle: ctx.inputs.ca_bundle.clone(), ..S3Options::default() };
        let report = oidc::check_issuer(&ctx.client, &hc, &ctx.inputs.hcp_namespace(), &s3, true).await?;
        if let Some(report) = &report {
            let (line, warn) = report.summary();
            if warn {
                ctx.warnings.push(line);
                ctx.warnings.extend(report.iam.iter().map(|need| format!("IAM (not checked): {need}")));
            } else {
                tracing::info!(issuer = %report.issuer, "{line}");
            }
        }
        Ok(report)
    }
}
