//! The protobuf messages of Yuanbao's bot socket, as prost structs.
//!
//! Field numbers follow the platform's descriptors (see the protocol
//! sheet): the connection layer (`ConnMsg` and its `Head`, auth-bind,
//! ping) and the business module `yuanbao_openclaw_proxy` (inbound pushes,
//! sends, heartbeats). Fields the adapter never reads are left out; prost
//! skips unknown fields when decoding.

use prost::Message;

/// `Head.cmd_type`: a request from the client.
pub const REQUEST: u32 = 0;
/// `Head.cmd_type`: the answer to a request (same `msg_id`).
pub const RESPONSE: u32 = 1;
/// `Head.cmd_type`: a push from the server.
pub const PUSH: u32 = 2;
/// `Head.cmd_type`: the client's acknowledgement of a push.
pub const PUSH_ACK: u32 = 3;

/// The connection layer's module.
pub const CONN_MODULE: &str = "conn_access";
/// The business module every message request goes to.
pub const BIZ_MODULE: &str = "yuanbao_openclaw_proxy";

/// Every frame on the socket.
#[derive(Clone, PartialEq, Message)]
pub struct ConnMsg {
    /// Routing: what the frame is and which request it answers.
    #[prost(message, optional, tag = "1")]
    pub head: Option<Head>,
    /// The command's own message, encoded.
    #[prost(bytes = "vec", tag = "2")]
    pub data: Vec<u8>,
}

/// A frame's routing header.
#[derive(Clone, PartialEq, Message)]
pub struct Head {
    /// [`REQUEST`], [`RESPONSE`], [`PUSH`] or [`PUSH_ACK`].
    #[prost(uint32, tag = "1")]
    pub cmd_type: u32,
    /// The command (`auth-bind`, `ping`, `send_c2c_message`, ...).
    #[prost(string, tag = "2")]
    pub cmd: String,
    /// The sender's running frame number.
    #[prost(uint32, tag = "3")]
    pub seq_no: u32,
    /// A request's id, echoed by its response; a push's id, echoed by its
    /// acknowledgement.
    #[prost(string, tag = "4")]
    pub msg_id: String,
    /// `conn_access` or the business module.
    #[prost(string, tag = "5")]
    pub module: String,
    /// The push must be acknowledged, or it comes again.
    #[prost(bool, tag = "6")]
    pub need_ack: bool,
    /// A response's transport status (0 when fine).
    #[prost(int32, tag = "10")]
    pub status: i32,
}

/// `auth-bind`'s request.
#[derive(Clone, PartialEq, Message)]
pub struct AuthBindReq {
    /// Always `ybBot`.
    #[prost(string, tag = "1")]
    pub biz_id: String,
    /// Who binds, with the signed token.
    #[prost(message, optional, tag = "2")]
    pub auth_info: Option<AuthInfo>,
    /// What is connecting.
    #[prost(message, optional, tag = "3")]
    pub device_info: Option<DeviceInfo>,
    /// The route environment (test deployments), when configured.
    #[prost(string, tag = "5")]
    pub env_name: String,
}

/// The bot's credentials in an auth-bind.
#[derive(Clone, PartialEq, Message)]
pub struct AuthInfo {
    /// The bot's account id.
    #[prost(string, tag = "1")]
    pub uid: String,
    /// The `source` sign-token returned.
    #[prost(string, tag = "2")]
    pub source: String,
    /// The token sign-token returned.
    #[prost(string, tag = "3")]
    pub token: String,
}

/// The client's description in an auth-bind.
#[derive(Clone, PartialEq, Message)]
pub struct DeviceInfo {
    /// The connector's version.
    #[prost(string, tag = "1")]
    pub app_version: String,
    /// The operating system.
    #[prost(string, tag = "2")]
    pub app_operation_system: String,
    /// The instance kind the platform expects from bots.
    #[prost(string, tag = "10")]
    pub instance_id: String,
    /// The bot framework's version.
    #[prost(string, tag = "24")]
    pub bot_version: String,
}

/// The answer to `auth-bind` (and the `{code, message}` shape of every
/// business response).
#[derive(Clone, PartialEq, Message)]
pub struct CodeRsp {
    /// 0 when it worked.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// Why not, when it did not.
    #[prost(string, tag = "2")]
    pub message: String,
}

/// A pushed message from a user or group (`inbound_message`).
#[derive(Clone, PartialEq, Message)]
pub struct InboundMessagePush {
    /// `C2C.CallbackAfterSendMsg`, `Group.CallbackAfterSendMsg`, recalls...
    #[prost(string, tag = "1")]
    pub callback_command: String,
    /// The sender's account.
    #[prost(string, tag = "2")]
    pub from_account: String,
    /// The addressee's account (the bot, in a DM).
    #[prost(string, tag = "3")]
    pub to_account: String,
    /// The sender's display name.
    #[prost(string, tag = "4")]
    pub sender_nickname: String,
    /// The group's internal id.
    #[prost(string, tag = "5")]
    pub group_id: String,
    /// The group's code: what sends and chat ids use.
    #[prost(string, tag = "6")]
    pub group_code: String,
    /// The group's name.
    #[prost(string, tag = "7")]
    pub group_name: String,
    /// The message's sequence number.
    #[prost(uint32, tag = "8")]
    pub msg_seq: u32,
    /// The message's random number.
    #[prost(uint32, tag = "9")]
    pub msg_random: u32,
    /// When it was sent (Unix seconds).
    #[prost(uint32, tag = "10")]
    pub msg_time: u32,
    /// The message's key.
    #[prost(string, tag = "11")]
    pub msg_key: String,
    /// The message's id: the dedupe key.
    #[prost(string, tag = "12")]
    pub msg_id: String,
    /// Its elements, in order.
    #[prost(message, repeated, tag = "13")]
    pub msg_body: Vec<MsgBodyElement>,
    /// JSON with extras (a quoted message).
    #[prost(string, tag = "14")]
    pub cloud_custom_data: String,
    /// When the event happened.
    #[prost(uint32, tag = "15")]
    pub event_time: u32,
    /// The bot owner's account.
    #[prost(string, tag = "16")]
    pub bot_owner_id: String,
    /// The messages a recall takes back.
    #[prost(message, repeated, tag = "17")]
    pub recall_msg_seq_list: Vec<ImMsgSeq>,
    /// 1 group, 2 private.
    #[prost(int32, tag = "18")]
    pub claw_msg_type: i32,
    /// The group a private chat was started from.
    #[prost(string, tag = "19")]
    pub private_from_group_code: String,
}

/// One recalled message.
#[derive(Clone, PartialEq, Message)]
pub struct ImMsgSeq {
    /// Its sequence number.
    #[prost(uint64, tag = "1")]
    pub msg_seq: u64,
    /// Its id.
    #[prost(string, tag = "2")]
    pub msg_id: String,
}

/// One element of a message body (Tencent IM style).
#[derive(Clone, PartialEq, Message)]
pub struct MsgBodyElement {
    /// `TIMTextElem`, `TIMCustomElem`, `TIMImageElem`, ...
    #[prost(string, tag = "1")]
    pub msg_type: String,
    /// The element's content.
    #[prost(message, optional, tag = "2")]
    pub msg_content: Option<MsgContent>,
}

/// An element's content; which fields are set depends on the type.
#[derive(Clone, PartialEq, Message)]
pub struct MsgContent {
    /// A text element's text.
    #[prost(string, tag = "1")]
    pub text: String,
    /// A media element's own id.
    #[prost(string, tag = "2")]
    pub uuid: String,
    /// An image's format: 1 JPEG, 2 GIF, 3 PNG, 4 BMP, 255 anything else.
    #[prost(uint32, tag = "3")]
    pub image_format: u32,
    /// A custom element's JSON (`elem_type` 1002 is a mention).
    #[prost(string, tag = "4")]
    pub data: String,
    /// A custom element's description.
    #[prost(string, tag = "5")]
    pub desc: String,
    /// An image's renditions (original, large, thumbnail).
    #[prost(message, repeated, tag = "8")]
    pub image_info_array: Vec<ImageInfo>,
    /// Where a file, voice note or video is.
    #[prost(string, tag = "10")]
    pub url: String,
    /// A file's size in bytes.
    #[prost(uint32, tag = "11")]
    pub file_size: u32,
    /// A file's name.
    #[prost(string, tag = "12")]
    pub file_name: String,
}

/// One rendition of an image element.
#[derive(Clone, PartialEq, Message)]
pub struct ImageInfo {
    /// 1 the original, 2 large, 3 a thumbnail.
    #[prost(uint32, tag = "1")]
    pub r#type: u32,
    /// Its size in bytes.
    #[prost(uint32, tag = "2")]
    pub size: u32,
    /// Its width in pixels (0 when unknown).
    #[prost(uint32, tag = "3")]
    pub width: u32,
    /// Its height in pixels (0 when unknown).
    #[prost(uint32, tag = "4")]
    pub height: u32,
    /// Where it is.
    #[prost(string, tag = "5")]
    pub url: String,
}

/// `send_c2c_message`'s request.
#[derive(Clone, PartialEq, Message)]
pub struct SendC2cMessageReq {
    /// The request's id.
    #[prost(string, tag = "1")]
    pub msg_id: String,
    /// The user written to.
    #[prost(string, tag = "2")]
    pub to_account: String,
    /// The bot.
    #[prost(string, tag = "3")]
    pub from_account: String,
    /// A random number telling apart two identical sends.
    #[prost(uint32, tag = "4")]
    pub msg_random: u32,
    /// The elements.
    #[prost(message, repeated, tag = "5")]
    pub msg_body: Vec<MsgBodyElement>,
}

/// `send_group_message`'s request.
#[derive(Clone, PartialEq, Message)]
pub struct SendGroupMessageReq {
    /// The request's id.
    #[prost(string, tag = "1")]
    pub msg_id: String,
    /// The group written to.
    #[prost(string, tag = "2")]
    pub group_code: String,
    /// The bot.
    #[prost(string, tag = "3")]
    pub from_account: String,
    /// Empty: the whole group.
    #[prost(string, tag = "4")]
    pub to_account: String,
    /// A random value telling apart two identical sends.
    #[prost(string, tag = "5")]
    pub random: String,
    /// The elements.
    #[prost(message, repeated, tag = "6")]
    pub msg_body: Vec<MsgBodyElement>,
    /// The message quoted, when answering one.
    #[prost(string, tag = "7")]
    pub ref_msg_id: String,
}

/// `send_private_heartbeat`'s request: the reply indicator in a DM.
#[derive(Clone, PartialEq, Message)]
pub struct PrivateHeartbeatReq {
    /// The bot.
    #[prost(string, tag = "1")]
    pub from_account: String,
    /// The user.
    #[prost(string, tag = "2")]
    pub to_account: String,
    /// [`RUNNING`] or [`FINISH`].
    #[prost(int32, tag = "3")]
    pub heartbeat: i32,
}

/// `send_group_heartbeat`'s request: the reply indicator in a group.
#[derive(Clone, PartialEq, Message)]
pub struct GroupHeartbeatReq {
    /// The bot.
    #[prost(string, tag = "1")]
    pub from_account: String,
    /// Empty.
    #[prost(string, tag = "2")]
    pub to_account: String,
    /// The group.
    #[prost(string, tag = "3")]
    pub group_code: String,
    /// Milliseconds since the epoch.
    #[prost(int64, tag = "4")]
    pub send_time: i64,
    /// [`RUNNING`] or [`FINISH`].
    #[prost(int32, tag = "5")]
    pub heartbeat: i32,
}

/// Heartbeat: the bot is working on an answer.
pub const RUNNING: i32 = 1;
/// Heartbeat: the bot is done.
pub const FINISH: i32 = 2;

/// `query_group_info`'s request (and the group part of the member list's).
#[derive(Clone, PartialEq, Message)]
pub struct QueryGroupInfoReq {
    /// The group.
    #[prost(string, tag = "1")]
    pub group_code: String,
}

/// `query_group_info`'s answer.
#[derive(Clone, PartialEq, Message)]
pub struct QueryGroupInfoRsp {
    /// 0 when it worked.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// Why not.
    #[prost(string, tag = "2")]
    pub message: String,
    /// The group.
    #[prost(message, optional, tag = "3")]
    pub group_info: Option<GroupInfo>,
}

/// A group's description.
#[derive(Clone, PartialEq, Message)]
pub struct GroupInfo {
    /// Its name.
    #[prost(string, tag = "1")]
    pub group_name: String,
    /// Its owner's account.
    #[prost(string, tag = "2")]
    pub group_owner_user_id: String,
    /// Its owner's name.
    #[prost(string, tag = "3")]
    pub group_owner_nickname: String,
    /// How many members it has.
    #[prost(uint32, tag = "4")]
    pub group_size: u32,
}

/// `get_group_member_list`'s request: one page.
#[derive(Clone, PartialEq, Message)]
pub struct GetGroupMemberListReq {
    /// The group.
    #[prost(string, tag = "1")]
    pub group_code: String,
    /// Where the page starts.
    #[prost(uint32, tag = "2")]
    pub offset: u32,
    /// How many members at most.
    #[prost(uint32, tag = "3")]
    pub limit: u32,
}

/// `get_group_member_list`'s answer.
#[derive(Clone, PartialEq, Message)]
pub struct GetGroupMemberListRsp {
    /// 0 when it worked.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// Why not.
    #[prost(string, tag = "2")]
    pub message: String,
    /// This page's members.
    #[prost(message, repeated, tag = "3")]
    pub members: Vec<MemberInfo>,
    /// Where the next page starts.
    #[prost(uint32, tag = "4")]
    pub next_offset: u32,
    /// No page follows.
    #[prost(bool, tag = "5")]
    pub is_complete: bool,
}

/// One group member.
#[derive(Clone, PartialEq, Message)]
pub struct MemberInfo {
    /// The member's account.
    #[prost(string, tag = "1")]
    pub user_id: String,
    /// The member's name.
    #[prost(string, tag = "2")]
    pub nickname: String,
    /// 0 member, 1 admin, 2 owner (see `link::Role` for what else is read
    /// here).
    #[prost(uint32, tag = "3")]
    pub role: u32,
    /// When the member joined (Unix seconds).
    #[prost(uint32, tag = "4")]
    pub join_time: u32,
    /// The member's name in this group, when set.
    #[prost(string, tag = "5")]
    pub name_card: String,
}
