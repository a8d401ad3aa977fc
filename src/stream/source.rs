//! Which etcd member the stream uses, and reaching it. The stream asks for
//! a member whenever it starts a watch or a base, and again when one fails
//! (naming the one to avoid). A hosted cluster's members are found through
//! the management cluster (`ops::stream` implements this over the same
//! discovery and TLS as `hcp-dr etcd status`); [`FixedMembers`] serves a
//! known list (a plain etcd, tests).

use std::time::Duration;

use async_trait::async_trait;

use crate::etcd::Member;

/// A member to use, and what keeps the way to it open.
pub struct Reached {
    pub member: Member,
    /// Held while the member is used (a port-forward through the API server).
    pub guard: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for Reached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reached").field("member", &self.member.name).finish_non_exhaustive()
    }
}

/// Where the stream finds a member to use.
#[async_trait]
pub trait MemberSource: Send + Sync {
    /// A healthy member, preferring followers (a watch of the whole
    /// keyspace is load the leader need not carry) and not one of `avoid`
    /// (members that just failed) unless no other is healthy. The error
    /// says which members were tried and why none would do.
    async fn reach(&self, avoid: &[String]) -> Result<Reached, String>;
}

/// The order to try members in: healthy followers, then a healthy leader,
/// those in `avoid` last; unhealthy ones never.
pub fn preference(candidates: &[(String, bool, bool)], avoid: &[String]) -> Vec<String> {
    let mut healthy: Vec<&(String, bool, bool)> = candidates.iter().filter(|(_, healthy, _)| *healthy).collect();
    healthy.sort_by_key(|(name, _, leader)| (avoid.contains(name), *leader, name.clone()));
    healthy.into_iter().map(|(name, _, _)| name.clone()).collect()
}

/// A fixed list of members, tried in order (those in `avoid` last); the
/// first that answers a status request is used.
pub struct FixedMembers(pub Vec<Member>);

#[async_trait]
impl MemberSource for FixedMembers {
    async fn reach(&self, avoid: &[String]) -> Result<Reached, String> {
        let mut order: Vec<&Member> = self.0.iter().collect();
        order.sort_by_key(|m| avoid.contains(&m.name));
        let mut errors = Vec::new();
        for member in order {
            let answered = tokio::time::timeout(Duration::from_secs(3), async {
                let mut client = member.connect().await?;
                member.status(&mut client).await
            })
            .await;
            match answered {
                Ok(Ok(_)) => return Ok(Reached { member: member.clone(), guard: None }),
                Ok(Err(err)) => errors.push(format!("{}: {err}", member.name)),
                Err(_) => errors.push(format!("{}: no answer within 3s", member.name)),
            }
        }
        Err(format!("no etcd member answers: {}", errors.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn followers_first_then_the_leader_and_failed_ones_last() {
        let members = [("etcd-0".to_string(), true, true), ("etcd-1".to_string(), true, false), ("etcd-2".to_string(), false, false)];
        assert_eq!(preference(&members, &[]), ["etcd-1", "etcd-0"]);
        assert_eq!(preference(&members, &["etcd-1".to_string()]), ["etcd-0", "etcd-1"]);
        assert!(preference(&[("etcd-0".to_string(), false, false)], &[]).is_empty());
    }
}
