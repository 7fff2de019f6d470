//! The fake's own protobuf messages for Yuanbao's socket, with the field
//! numbers of the protocol sheet, and builders for the pushes tests send.

use prost::Message;

/// `Head.cmd_type` of a client request.
pub const REQUEST: u32 = 0;
/// `Head.cmd_type` of a response.
pub const RESPONSE: u32 = 1;
/// `Head.cmd_type` of a server push.
pub const PUSH: u32 = 2;
/// `Head.cmd_type` of a push acknowledgement.
pub const PUSH_ACK: u32 = 3;
/// The connection module.
pub const CONN_MODULE: &str = "conn_access";
/// The business module.
pub const BIZ_MODULE: &str = "yuanbao_openclaw_proxy";

/// A frame.
#[derive(Clone, PartialEq, Message)]
pub struct ConnMsg {
    /// The header.
    #[prost(message, optional, tag = "1")]
    pub head: Option<Head>,
    /// The payload.
    #[prost(bytes = "vec", tag = "2")]
    pub data: Vec<u8>,
}

/// A frame's header.
#[derive(Clone, PartialEq, Message)]
pub struct Head {
    /// Request, response, push or push-ack.
    #[prost(uint32, tag = "1")]
    pub cmd_type: u32,
    /// The command.
    #[prost(string, tag = "2")]
    pub cmd: String,
    /// The sender's frame number.
    #[prost(uint32, tag = "3")]
    pub seq_no: u32,
    /// The request's or push's id.
    #[prost(string, tag = "4")]
    pub msg_id: String,
    /// The module.
    #[prost(string, tag = "5")]
    pub module: String,
    /// The push wants an ack.
    #[prost(bool, tag = "6")]
    pub need_ack: bool,
    /// Transport status.
    #[prost(int32, tag = "10")]
    pub status: i32,
}

/// auth-bind's request.
#[derive(Clone, PartialEq, Message)]
pub struct AuthBindReq {
    /// `ybBot`.
    #[prost(string, tag = "1")]
    pub biz_id: String,
    /// The credentials.
    #[prost(message, optional, tag = "2")]
    pub auth_info: Option<AuthInfo>,
    /// The route environment.
    #[prost(string, tag = "5")]
    pub env_name: String,
}

/// The credentials of an auth-bind.
#[derive(Clone, PartialEq, Message)]
pub struct AuthInfo {
    /// The bot id.
    #[prost(string, tag = "1")]
    pub uid: String,
    /// The token's source.
    #[prost(string, tag = "2")]
    pub source: String,
    /// The token.
    #[prost(string, tag = "3")]
    pub token: String,
}

/// `{code, message}`.
#[derive(Clone, PartialEq, Message)]
pub struct CodeRsp {
    /// 0 on success.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// Why not.
    #[prost(string, tag = "2")]
    pub message: String,
}

/// The inbound message push.
#[derive(Clone, PartialEq, Message)]
pub struct InboundMessagePush {
    /// The IM callback.
    #[prost(string, tag = "1")]
    pub callback_command: String,
    /// Sender.
    #[prost(string, tag = "2")]
    pub from_account: String,
    /// Addressee.
    #[prost(string, tag = "3")]
    pub to_account: String,
    /// Sender's name.
    #[prost(string, tag = "4")]
    pub sender_nickname: String,
    /// Group code.
    #[prost(string, tag = "6")]
    pub group_code: String,
    /// Group name.
    #[prost(string, tag = "7")]
    pub group_name: String,
    /// Sequence number.
    #[prost(uint32, tag = "8")]
    pub msg_seq: u32,
    /// Message id.
    #[prost(string, tag = "12")]
    pub msg_id: String,
    /// Elements.
    #[prost(message, repeated, tag = "13")]
    pub msg_body: Vec<MsgBodyElement>,
    /// Extras (JSON).
    #[prost(string, tag = "14")]
    pub cloud_custom_data: String,
    /// The bot's owner.
    #[prost(string, tag = "16")]
    pub bot_owner_id: String,
    /// Recalled messages.
    #[prost(message, repeated, tag = "17")]
    pub recall_msg_seq_list: Vec<ImMsgSeq>,
}

/// A recalled message.
#[derive(Clone, PartialEq, Message)]
pub struct ImMsgSeq {
    /// Its sequence number.
    #[prost(uint64, tag = "1")]
    pub msg_seq: u64,
    /// Its id.
    #[prost(string, tag = "2")]
    pub msg_id: String,
}

/// One element.
#[derive(Clone, PartialEq, Message)]
pub struct MsgBodyElement {
    /// Its type.
    #[prost(string, tag = "1")]
    pub msg_type: String,
    /// Its content.
    #[prost(message, optional, tag = "2")]
    pub msg_content: Option<MsgContent>,
}

/// An element's content.
#[derive(Clone, PartialEq, Message)]
pub struct MsgContent {
    /// Text.
    #[prost(string, tag = "1")]
    pub text: String,
    /// A media element's id.
    #[prost(string, tag = "2")]
    pub uuid: String,
    /// 1 JPEG, 2 GIF, 3 PNG, 4 BMP, 255 other.
    #[prost(uint32, tag = "3")]
    pub image_format: u32,
    /// Custom data (JSON).
    #[prost(string, tag = "4")]
    pub data: String,
    /// An image's renditions.
    #[prost(message, repeated, tag = "8")]
    pub image_info_array: Vec<ImageInfo>,
    /// A file's, voice note's or video's address.
    #[prost(string, tag = "10")]
    pub url: String,
    /// A file's size.
    #[prost(uint32, tag = "11")]
    pub file_size: u32,
    /// A file's name.
    #[prost(string, tag = "12")]
    pub file_name: String,
}

/// One rendition of an image.
#[derive(Clone, PartialEq, Message)]
pub struct ImageInfo {
    /// 1 original, 2 large, 3 thumbnail.
    #[prost(uint32, tag = "1")]
    pub r#type: u32,
    /// Bytes.
    #[prost(uint32, tag = "2")]
    pub size: u32,
    /// Pixels.
    #[prost(uint32, tag = "3")]
    pub width: u32,
    /// Pixels.
    #[prost(uint32, tag = "4")]
    pub height: u32,
    /// Address.
    #[prost(string, tag = "5")]
    pub url: String,
}

/// send_c2c_message.
#[derive(Clone, PartialEq, Message)]
pub struct SendC2cMessageReq {
    /// Request id.
    #[prost(string, tag = "1")]
    pub msg_id: String,
    /// The user.
    #[prost(string, tag = "2")]
    pub to_account: String,
    /// The bot.
    #[prost(string, tag = "3")]
    pub from_account: String,
    /// Random.
    #[prost(uint32, tag = "4")]
    pub msg_random: u32,
    /// Elements.
    #[prost(message, repeated, tag = "5")]
    pub msg_body: Vec<MsgBodyElement>,
}

/// send_group_message.
#[derive(Clone, PartialEq, Message)]
pub struct SendGroupMessageReq {
    /// Request id.
    #[prost(string, tag = "1")]
    pub msg_id: String,
    /// The group.
    #[prost(string, tag = "2")]
    pub group_code: String,
    /// The bot.
    #[prost(string, tag = "3")]
    pub from_account: String,
    /// Empty.
    #[prost(string, tag = "4")]
    pub to_account: String,
    /// Random.
    #[prost(string, tag = "5")]
    pub random: String,
    /// Elements.
    #[prost(message, repeated, tag = "6")]
    pub msg_body: Vec<MsgBodyElement>,
    /// Quoted message.
    #[prost(string, tag = "7")]
    pub ref_msg_id: String,
}

/// send_private_heartbeat.
#[derive(Clone, PartialEq, Message)]
pub struct PrivateHeartbeatReq {
    /// The bot.
    #[prost(string, tag = "1")]
    pub from_account: String,
    /// The user.
    #[prost(string, tag = "2")]
    pub to_account: String,
    /// 1 running, 2 finish.
    #[prost(int32, tag = "3")]
    pub heartbeat: i32,
}

/// send_group_heartbeat.
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
    /// Milliseconds.
    #[prost(int64, tag = "4")]
    pub send_time: i64,
    /// 1 running, 2 finish.
    #[prost(int32, tag = "5")]
    pub heartbeat: i32,
}

/// query_group_info / get_group_member_list requests (the group code
/// first; the member list's offset and limit after it).
#[derive(Clone, PartialEq, Message)]
pub struct GroupCodeReq {
    /// The group.
    #[prost(string, tag = "1")]
    pub group_code: String,
    /// Where the member page starts.
    #[prost(uint32, tag = "2")]
    pub offset: u32,
    /// How many members the page holds at most.
    #[prost(uint32, tag = "3")]
    pub limit: u32,
}

/// query_group_info's answer.
#[derive(Clone, PartialEq, Message)]
pub struct QueryGroupInfoRsp {
    /// 0 on success.
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
    /// Name.
    #[prost(string, tag = "1")]
    pub group_name: String,
    /// Owner's id.
    #[prost(string, tag = "2")]
    pub group_owner_user_id: String,
    /// Owner's name.
    #[prost(string, tag = "3")]
    pub group_owner_nickname: String,
    /// Members.
    #[prost(int32, tag = "4")]
    pub group_size: i32,
}

/// get_group_member_list's answer.
#[derive(Clone, PartialEq, Message)]
pub struct GroupMemberListRsp {
    /// 0 on success.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// Why not.
    #[prost(string, tag = "2")]
    pub message: String,
    /// Members.
    #[prost(message, repeated, tag = "3")]
    pub members: Vec<Member>,
    /// Where the next page starts.
    #[prost(uint32, tag = "4")]
    pub next_offset: u32,
    /// No more pages.
    #[prost(bool, tag = "5")]
    pub is_complete: bool,
}

/// A group member.
#[derive(Clone, PartialEq, Message)]
pub struct Member {
    /// Account.
    #[prost(string, tag = "1")]
    pub user_id: String,
    /// Name.
    #[prost(string, tag = "2")]
    pub nickname: String,
    /// 0 member, 1 admin, 2 owner.
    #[prost(int32, tag = "3")]
    pub role: i32,
    /// The name in this group, when set.
    #[prost(string, tag = "5")]
    pub name_card: String,
}

/// A text element.
pub fn text(t: &str) -> MsgBodyElement {
    MsgBodyElement {
        msg_type: "TIMTextElem".into(),
        msg_content: Some(MsgContent {
            text: t.into(),
            ..MsgContent::default()
        }),
    }
}

/// An @-mention of `user_id` shown as `@name` (custom element 1002).
pub fn mention(user_id: &str, name: &str) -> MsgBodyElement {
    MsgBodyElement {
        msg_type: "TIMCustomElem".into(),
        msg_content: Some(MsgContent {
            data: serde_json::json!({ "elem_type": 1002, "text": format!("@{name}"), "user_id": user_id })
                .to_string(),
            ..MsgContent::default()
        }),
    }
}

/// A private message from `from`.
pub fn dm(from: &str, msg_id: &str, body: &str) -> InboundMessagePush {
    InboundMessagePush {
        callback_command: "C2C.CallbackAfterSendMsg".into(),
        from_account: from.into(),
        to_account: super::BOT_ID.into(),
        sender_nickname: format!("{from}-nick"),
        msg_id: msg_id.into(),
        msg_body: vec![text(body)],
        bot_owner_id: super::OWNER_ID.into(),
        ..InboundMessagePush::default()
    }
}

/// A group message from `from` in `group_code`.
pub fn group(
    from: &str,
    group_code: &str,
    msg_id: &str,
    body: Vec<MsgBodyElement>,
) -> InboundMessagePush {
    InboundMessagePush {
        callback_command: "Group.CallbackAfterSendMsg".into(),
        from_account: from.into(),
        sender_nickname: format!("{from}-nick"),
        group_code: group_code.into(),
        group_name: format!("Pai {group_code}"),
        msg_id: msg_id.into(),
        msg_body: body,
        bot_owner_id: super::OWNER_ID.into(),
        ..InboundMessagePush::default()
    }
}

/// A recall of `msg_ids` in a group.
pub fn group_recall(group_code: &str, msg_ids: &[&str]) -> InboundMessagePush {
    InboundMessagePush {
        callback_command: "Group.CallbackAfterRecallMsg".into(),
        group_code: group_code.into(),
        recall_msg_seq_list: msg_ids
            .iter()
            .enumerate()
            .map(|(i, id)| ImMsgSeq {
                msg_seq: i as u64 + 1,
                msg_id: (*id).into(),
            })
            .collect(),
        ..InboundMessagePush::default()
    }
}
