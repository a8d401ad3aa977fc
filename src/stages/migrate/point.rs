//! `point-in-time`: a migration to an earlier point (`migrate --at`). The
//! source's writers are stopped and its own backup is taken as in every
//! migration (so what it wrote after the point stays in the store); then the
//! cluster's stream is replayed to the point into a point-in-time backup
//! (`ops::point_in_time::materialize`), and the destination restores that
//! one instead. Without `--at` it does nothing.
//!
//! The seeded members must start above every revision a client of the
//! source saw, which is the migration's own backup's, not the point's: the
//! bump covers the difference.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::MigrateContext;
use crate::ops::point_in_time::Materialized;
use crate::pipeline::{Stage, StageId, StageFailure, Step};
use crate::stages::StageError;
use crate::stages::etcd_restore::BUMP_MARGIN;
use crate::stages::package::Package;

pub struct PointInTime;

/// The point-in-time backup the destination restores, and the bump of
/// its seeded members (`None`: no `--at`, the migration's own backup).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Chosen {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub materialized: Option<Materialized>,
    /// The revision the source reached (its own backup's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_revision: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bump_revision: Option<u64>,
}

impl StageId for PointInTime {
    const NAME: &'static str = "point-in-time";
    type Output = Chosen;
}

/// The bump that puts a point at `point_revision` above `source_revision`
/// (what the source reached) with hcp-dr's margin; a `given` one smaller
/// than that is refused.
pub fn bump_for(point_revision: i64, source_revision: i64, given: Option<u64>) -> Result<u64, String> {
    let needed = (source_revision - point_revision).max(0) as u64 + BUMP_MARGIN;
    match given {
        Some(given) if given < needed => Err(format!(
            "--bump-revision {given} is too small for a point at revision {point_revision}: the source reached revision {source_revision}, so its clients may hold resourceVersions up to it; give at least {needed} or drop --bump-revision"
        )),
        Some(given) => Ok(given),
        None => Ok(needed),
    }
}

/// Point the destination at the point-in-time backup (also on resume).
fn aim(ctx: &mut MigrateContext, chosen: &Chosen) {
    if let Some(made) = &chosen.materialized {
        let destination = &mut ctx.destination.inputs;
        destination.backup_id = made.backup_id.clone();
        destination.point_in_time = Some(made.clone());
        destination.etcd_seed.bump_revision = chosen.bump_revision;
        ctx.inputs.destination = destination.clone();
    }
}

#[async_trait]
impl Stage<MigrateContext> for PointInTime {
    fn summary(&self) -> &'static str {
        "with --at: replay the cluster's stream to the point into a point-in-time backup, which the destination restores instead of the migration's own"
    }
    fn mutates(&self) -> bool {
        true
    }
    fn plan(&self, ctx: &MigrateContext, _step: &Step<'_>) -> Vec<String> {
        match &ctx.inputs.at {
            None => vec!["nothing: no --at, the destination restores this migration's own backup".into()],
            Some(at) => vec![format!(
                "replay the stream of {}/{} in {} to {} into a point-in-time backup; the destination restores it (the writes after it stay in this migration's own backup, not restored)",
                ctx.inputs.source.namespace,
                ctx.inputs.source.hosted_cluster,
                ctx.source.store.url(),
                at.target
            )],
        }
    }
    async fn run(&self, ctx: &mut MigrateContext, step: &mut Step<'_>) -> Result<Self::Output, StageFailure> {
        let Some(at) = ctx.inputs.at.clone() else { return Ok(Chosen::default()) };
        let packaged = step.needs::<Package>()?;
        let source_revision = packaged
            .revision
            .ok_or_else(|| StageError::Precondition("the migration's own backup records no etcd revision: the bump above what the source reached cannot be chosen".into()))?;
        let seed = ctx.inputs.destination.etcd_seed.clone();
        let precheck = move |manifest: &crate::archive::Manifest| {
            crate::stages::restore::etcd_seed::resolve_mode(&seed, &manifest.cluster.availability_policy).map(|_| ()).map_err(crate::ops::OpsError::Input)
        };
        let (namespace, hosted_cluster) = (ctx.inputs.source.namespace.clone(), ctx.inputs.source.hosted_cluster.clone());
        let made = crate::ops::point_in_time::materialize(ctx.source.store.clone(), &namespace, &hosted_cluster, &at, false, &precheck)
            .await
            .map_err(|e| StageError::Precondition(format!("the point {}: {e}", at.target)))?;
        let bump = bump_for(made.point.revision, source_revision, ctx.inputs.destination.etcd_seed.bump_revision).map_err(StageError::Precondition)?;
        tracing::info!("{}; the seeded members are bumped by {bump} (the source reached revision {source_revision})", made.describe());
        let chosen = Chosen { materialized: Some(made), source_revision: Some(source_revision), bump_revision: Some(bump) };
        aim(ctx, &chosen);
        Ok(chosen)
    }
    fn restore(&self, ctx: &mut MigrateContext, output: Self::Output) -> Result<(), StageFailure> {
        aim(ctx, &output);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bump_covers_what_the_source_reached_after_the_point() {
        assert_eq!(bump_for(900, 1000, None), Ok(100 + BUMP_MARGIN));
        assert_eq!(bump_for(1000, 1000, None), Ok(BUMP_MARGIN));
        assert_eq!(bump_for(900, 1000, Some(100 + BUMP_MARGIN + 5)), Ok(100 + BUMP_MARGIN + 5));
        let refused = bump_for(900, 1000, Some(10)).unwrap_err();
        assert!(refused.contains("--bump-revision 10 is too small") && refused.contains(&format!("at least {}", 100 + BUMP_MARGIN)), "{refused}");
    }
}
