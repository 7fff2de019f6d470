//! [`YuanbaoLink`]: the live socket's request channel, shared by the
//! adapter (which opens the socket and routes the answers) and whoever
//! else asks the platform something over it (the `yb_*` group tools).
//!
//! Yuanbao answers business requests only on the bot's one bound socket:
//! a request is a frame with an id, its answer a frame echoing that id.
//! The link holds the socket's writer while there is one, the requests
//! awaiting their answer (bounded), and the frame numbering; it is made
//! once per process (`talaria gateway run` makes it where it builds the
//! adapters and the agent's tools) and handed to both, so a tool call
//! rides the same socket the messages do, and says plainly when there is
//! none.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message as _;
use tokio::sync::{mpsc, oneshot};

use super::proto::{self, BIZ_MODULE, ConnMsg, Head};

/// Requests waiting for their answer at most; more are refused rather
/// than queued without bound.
const MAX_PENDING: usize = 256;

/// How long a request waits for its answer unless the adapter says
/// otherwise (the platform's own client waits 30 s).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Members one page of `get_group_member_list` asks for.
pub const MEMBER_PAGE: u32 = 200;

/// A response to a request: the head's transport status and the data.
pub(super) type Response = (i32, Vec<u8>);

/// Why a request over the link got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// No Yuanbao adapter runs in this process (a `talaria chat`
    /// session): only a running gateway holds the socket.
    #[error(
        "Yuanbao is not connected in this process: the Yuanbao tools work inside a running \
         gateway (`talaria gateway run`)"
    )]
    NoAdapter,
    /// The adapter runs but its socket is down (connecting, or between
    /// reconnects).
    #[error("Yuanbao's connection is down right now (it reconnects by itself); try again shortly")]
    Down,
    /// Too many requests are waiting already.
    #[error("too many Yuanbao requests are in flight; try again shortly")]
    Busy,
    /// The socket closed before the answer came: the request may or may
    /// not have been carried out.
    #[error("the Yuanbao connection closed before it answered {0}")]
    Closed(String),
    /// No answer in time: the request may or may not have been carried
    /// out.
    #[error("Yuanbao did not answer {0} in time")]
    Timeout(String),
    /// The answer came but says the request failed, or cannot be read.
    #[error("Yuanbao refused {cmd}: {why}")]
    Refused {
        /// The command.
        cmd: String,
        /// The platform's code and message, or what was wrong with them.
        why: String,
    },
}

#[derive(Debug, Default)]
struct Inner {
    /// The live socket's writer, while there is one.
    writer: Mutex<Option<mpsc::Sender<Vec<u8>>>>,
    /// Requests awaiting their answer, by request id.
    pending: Mutex<HashMap<String, oneshot::Sender<Response>>>,
    next_id: AtomicU64,
    seq: AtomicU32,
    /// An adapter was built on this link.
    attached: AtomicBool,
    /// How long a request waits, in milliseconds (0: the default).
    timeout_ms: AtomicU64,
    /// The bot's own account, once known: its member entry is a bot.
    bot_id: Mutex<Option<String>>,
}

/// The live socket's request channel (see the module docs). Cloning
/// shares it.
#[derive(Debug, Clone, Default)]
pub struct YuanbaoLink {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One group's description, as `query_group_info` gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSummary {
    /// The group's name.
    pub name: String,
    /// Its owner's account.
    pub owner_id: String,
    /// Its owner's name.
    pub owner_nickname: String,
    /// How many members it has.
    pub member_count: u32,
}

/// What a member is in a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// An ordinary member.
    Member,
    /// An admin.
    Admin,
    /// The owner.
    Owner,
    /// A bot. The protocol sheet documents roles 0–2 only; the platform's
    /// own connector reads 3 in the same field as a bot, which is taken
    /// here (and a member whose account is this bot's).
    Bot,
}

impl Role {
    fn from_wire(role: u32) -> Role {
        match role {
            1 => Role::Admin,
            2 => Role::Owner,
            3 => Role::Bot,
            _ => Role::Member,
        }
    }

    /// The role's name in tool output.
    pub fn name(self) -> &'static str {
        match self {
            Role::Member => "member",
            Role::Admin => "admin",
            Role::Owner => "owner",
            Role::Bot => "bot",
        }
    }
}

/// One group member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    /// The member's account.
    pub user_id: String,
    /// The member's name: the name in this group when set, else the
    /// nickname.
    pub nickname: String,
    /// What the member is.
    pub role: Role,
}

/// A group's members, as far as they were listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberList {
    /// The members read.
    pub members: Vec<GroupMember>,
    /// More members exist than were read (the bound was reached).
    pub truncated: bool,
}

impl YuanbaoLink {
    /// A link no adapter uses yet.
    pub fn new() -> YuanbaoLink {
        YuanbaoLink::default()
    }

    /// Marks the link as an adapter's, whose requests wait `timeout`.
    pub(super) fn attach(&self, timeout: Duration) {
        self.inner.attached.store(true, Ordering::Relaxed);
        let ms = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.inner.timeout_ms.store(ms, Ordering::Relaxed);
    }

    /// The bot's own account is `bot_id`.
    pub(super) fn set_bot(&self, bot_id: &str) {
        *lock(&self.inner.bot_id) = Some(bot_id.to_owned());
    }

    fn timeout(&self) -> Duration {
        match self.inner.timeout_ms.load(Ordering::Relaxed) {
            0 => DEFAULT_TIMEOUT,
            ms => Duration::from_millis(ms),
        }
    }

    /// The socket is bound and writable now.
    pub fn is_up(&self) -> bool {
        lock(&self.inner.writer).is_some()
    }

    /// A fresh request id, `<prefix>_<n>`.
    pub(super) fn next_id(&self, prefix: &str) -> String {
        format!(
            "{prefix}_{}",
            self.inner.next_id.fetch_add(1, Ordering::Relaxed) + 1
        )
    }

    /// One frame, numbered.
    pub(super) fn frame(
        &self,
        cmd_type: u32,
        cmd: &str,
        module: &str,
        msg_id: &str,
        data: Vec<u8>,
    ) -> Vec<u8> {
        ConnMsg {
            head: Some(Head {
                cmd_type,
                cmd: cmd.to_owned(),
                seq_no: self.inner.seq.fetch_add(1, Ordering::Relaxed),
                msg_id: msg_id.to_owned(),
                module: module.to_owned(),
                need_ack: false,
                status: 0,
            }),
            data,
        }
        .encode_to_vec()
    }

    /// The bound socket's writer is `writer` from now on.
    pub(super) fn connected(&self, writer: mpsc::Sender<Vec<u8>>) {
        *lock(&self.inner.writer) = Some(writer);
    }

    /// The socket is gone: no writer, and the waiting requests learn it
    /// (their answers cannot come on another socket).
    pub(super) fn disconnected(&self) {
        *lock(&self.inner.writer) = None;
        lock(&self.inner.pending).clear();
    }

    /// Hands an answer to the request waiting for it; `false` when none
    /// waits (it timed out, or the id is not ours).
    pub(super) fn answer(&self, msg_id: &str, response: Response) -> bool {
        match lock(&self.inner.pending).remove(msg_id) {
            Some(waiter) => waiter.send(response).is_ok(),
            None => false,
        }
    }

    /// Sends one business request and waits for its answer's data.
    pub(super) async fn request(
        &self,
        cmd: &str,
        prefix: &str,
        data: Vec<u8>,
    ) -> Result<Vec<u8>, LinkError> {
        let Some(writer) = lock(&self.inner.writer).clone() else {
            return Err(if self.inner.attached.load(Ordering::Relaxed) {
                LinkError::Down
            } else {
                LinkError::NoAdapter
            });
        };
        let id = self.next_id(prefix);
        let frame = self.frame(proto::REQUEST, cmd, BIZ_MODULE, &id, data);
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = lock(&self.inner.pending);
            if pending.len() >= MAX_PENDING {
                return Err(LinkError::Busy);
            }
            pending.insert(id.clone(), tx);
        }
        if writer.send(frame).await.is_err() {
            lock(&self.inner.pending).remove(&id);
            return Err(LinkError::Down);
        }
        match tokio::time::timeout(self.timeout(), rx).await {
            Ok(Ok((0, data))) => Ok(data),
            Ok(Ok((status, _))) => Err(LinkError::Refused {
                cmd: cmd.to_owned(),
                why: format!("transport status {status}"),
            }),
            Ok(Err(_)) => Err(LinkError::Closed(cmd.to_owned())),
            Err(_) => {
                lock(&self.inner.pending).remove(&id);
                Err(LinkError::Timeout(cmd.to_owned()))
            }
        }
    }

    /// `query_group_info`: the group's name, owner and size.
    pub async fn query_group_info(&self, group_code: &str) -> Result<GroupSummary, LinkError> {
        let group_code = checked_group(group_code)?;
        let data = proto::QueryGroupInfoReq {
            group_code: group_code.to_owned(),
        }
        .encode_to_vec();
        let cmd = "query_group_info";
        let answer = self.request(cmd, "qgi", data).await?;
        let rsp =
            proto::QueryGroupInfoRsp::decode(answer.as_slice()).map_err(|e| unreadable(cmd, &e))?;
        if rsp.code != 0 {
            return Err(refused(cmd, rsp.code, &rsp.message));
        }
        let info = rsp.group_info.unwrap_or_default();
        Ok(GroupSummary {
            name: info.group_name,
            owner_id: info.group_owner_user_id,
            owner_nickname: info.group_owner_nickname,
            member_count: info.group_size,
        })
    }

    /// `get_group_member_list`, page after page until the list is complete
    /// or `max` members were read (then `truncated`).
    pub async fn group_members(
        &self,
        group_code: &str,
        max: usize,
    ) -> Result<MemberList, LinkError> {
        let group_code = checked_group(group_code)?;
        let bot_id = lock(&self.inner.bot_id).clone();
        let cmd = "get_group_member_list";
        let mut members = Vec::new();
        let mut offset = 0u32;
        // Each page moves the offset forward or ends the walk, so a server
        // that repeats itself cannot keep it going; the page count is
        // bounded too.
        let max_pages = max / MEMBER_PAGE as usize + 2;
        for _ in 0..max_pages {
            let data = proto::GetGroupMemberListReq {
                group_code: group_code.to_owned(),
                offset,
                limit: MEMBER_PAGE,
            }
            .encode_to_vec();
            let answer = self.request(cmd, "gml", data).await?;
            let rsp = proto::GetGroupMemberListRsp::decode(answer.as_slice())
                .map_err(|e| unreadable(cmd, &e))?;
            if rsp.code != 0 {
                return Err(refused(cmd, rsp.code, &rsp.message));
            }
            for m in rsp.members {
                if members.len() >= max {
                    return Ok(MemberList {
                        members,
                        truncated: true,
                    });
                }
                let role = if bot_id.as_deref() == Some(m.user_id.as_str()) {
                    Role::Bot
                } else {
                    Role::from_wire(m.role)
                };
                let nickname = if m.name_card.trim().is_empty() {
                    m.nickname
                } else {
                    m.name_card
                };
                members.push(GroupMember {
                    user_id: m.user_id,
                    nickname,
                    role,
                });
            }
            if rsp.is_complete || rsp.next_offset <= offset {
                return Ok(MemberList {
                    members,
                    truncated: false,
                });
            }
            offset = rsp.next_offset;
        }
        Ok(MemberList {
            members,
            truncated: true,
        })
    }
}

/// A group code as requests carry it: trimmed, non-empty, short, no
/// control characters.
fn checked_group(group_code: &str) -> Result<&str, LinkError> {
    let g = group_code.trim();
    let g = g.strip_prefix("group:").unwrap_or(g);
    if g.is_empty() || g.len() > 128 || g.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(LinkError::Refused {
            cmd: "the request".into(),
            why: format!("{group_code:?} is not a group code"),
        });
    }
    Ok(g)
}

fn unreadable(cmd: &str, e: &prost::DecodeError) -> LinkError {
    LinkError::Refused {
        cmd: cmd.to_owned(),
        why: format!("unreadable answer: {e}"),
    }
}

fn refused(cmd: &str, code: i32, message: &str) -> LinkError {
    let message: String = message.chars().take(200).collect();
    LinkError::Refused {
        cmd: cmd.to_owned(),
        why: format!("code {code}: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_link_without_an_adapter_or_socket_says_which() {
        let link = YuanbaoLink::new();
        assert_eq!(link.query_group_info("g1").await, Err(LinkError::NoAdapter));
        link.attach(Duration::from_secs(1));
        assert_eq!(link.query_group_info("g1").await, Err(LinkError::Down));
        assert!(matches!(
            link.query_group_info(" ").await,
            Err(LinkError::Refused { .. })
        ));
    }

    #[tokio::test]
    async fn an_answer_reaches_its_request_and_a_drop_ends_the_wait() {
        let link = YuanbaoLink::new();
        link.attach(Duration::from_secs(5));
        let (tx, mut rx) = mpsc::channel(4);
        link.connected(tx);
        let l = link.clone();
        let ask = tokio::spawn(async move { l.request("x", "t", vec![1]).await });
        let frame = rx.recv().await.unwrap();
        let head = ConnMsg::decode(frame.as_slice()).unwrap().head.unwrap();
        assert_eq!(head.module, BIZ_MODULE);
        assert!(link.answer(&head.msg_id, (0, vec![7])));
        assert_eq!(ask.await.unwrap(), Ok(vec![7]));
        // A second request is cut off by the socket going away.
        let l = link.clone();
        let ask = tokio::spawn(async move { l.request("y", "t", vec![]).await });
        let _ = rx.recv().await.unwrap();
        link.disconnected();
        assert_eq!(ask.await.unwrap(), Err(LinkError::Closed("y".into())));
    }
}
