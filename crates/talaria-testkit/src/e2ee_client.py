"""An end-to-end encrypting Matrix client for Talaria's tests, on matrix-nio.

Driven by `matrix_e2ee.rs`: one JSON object a line on stdin, each a
command with an `id`; one JSON object a line on stdout for each, with the
same `id` and either `"ok": true` and the result or `"ok": false` and an
`error`. Commands run concurrently, so answers may come out of order.
Everything nio logs goes to stderr.

Commands: login, create_room, join, send_text, send_file, next_message,
wait_joined, quit. File bytes travel as base64, both ways. The process exits on stdin EOF, on `quit`, and when the process that
started it is gone.
"""

import asyncio
import base64
import io
import json
import logging
import os
import sys
import threading
import time
import traceback

# Answers go to the real stdout; anything else that prints (a library's
# stray print) lands on stderr instead of corrupting the protocol.
_ANSWERS = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

logging.basicConfig(
    stream=sys.stderr,
    level=logging.DEBUG if os.environ.get("TALARIA_NIO_DEBUG") else logging.INFO,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)
log = logging.getLogger("e2ee_client")

from nio import (  # noqa: E402
    AsyncClient,
    AsyncClientConfig,
    BadEvent,
    DownloadError,
    JoinError,
    JoinedMembersError,
    LoginResponse,
    MegolmEvent,
    RoomCreateError,
    RoomMessage,
    RoomPreset,
    RoomSendResponse,
    SyncResponse,
    UnknownBadEvent,
    UploadResponse,
)
from nio.crypto import ENCRYPTION_ENABLED  # noqa: E402
from nio.crypto.attachments import decrypt_attachment  # noqa: E402

# How long an event nio cannot decrypt yet is given for its key to arrive
# (the key's to-device message may come a sync or two after the event)
# before a wait reports it undecrypted.
KEY_GRACE_SECONDS = 10.0

# How long a room nio was told about may take to show up in its sync.
ROOM_TIMEOUT_SECONDS = 30.0

# How long a received message's file may take to download (and decrypt)
# before the message is returned without it; below the Rust side's slack
# for an answer, so the reason arrives rather than a timeout.
DOWNLOAD_TIMEOUT_SECONDS = 20.0

# The longest command line read from stdin (a file to send comes as base64
# in one line; asyncio's default limit is 64 KiB).
LINE_LIMIT = 512 * 1024 * 1024


def watch_parent():
    """Exits when the process that started this one is gone."""
    parent = os.getppid()
    while True:
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(0.5)


class Entry:
    """One m.room.message (or an encrypted event that may be one) seen in a room."""

    def __init__(self, event_id, sender):
        self.event_id = event_id
        self.sender = sender
        self.body = ""
        self.content = {}
        self.encrypted = False
        self.decrypted = False
        self.relates_to = None
        self.detail = None
        # The attachment's plaintext, once fetched: `file_encrypted` tells
        # whether it came from a `file` object (decrypted) or a plain `url`.
        self.file = None
        self.file_encrypted = False
        self.returned = False
        self.seen_at = time.monotonic()
        # The undecrypted event, kept to retry once its key arrives.
        self.megolm = None
        self.key_requested = False

    def fill_from_message(self, event):
        content = event.source.get("content", {}) or {}
        self.content = content
        self.body = content.get("body", "") or ""
        self.relates_to = content.get("m.relates_to")
        self.decrypted = bool(getattr(event, "decrypted", False))
        self.encrypted = self.encrypted or self.decrypted
        self.megolm = None
        self.detail = None

    def as_json(self):
        return {
            "event_id": self.event_id,
            "sender": self.sender,
            "body": self.body,
            "content": self.content,
            "encrypted": self.encrypted,
            "decrypted": self.decrypted,
            "relates_to": self.relates_to,
            "detail": self.detail,
            "file": base64.b64encode(self.file).decode("ascii") if self.file is not None else None,
            "file_encrypted": self.file_encrypted,
        }


class Harness:
    def __init__(self):
        self.client = None
        self.synced_once = False
        self.sync_count = 0
        # room id -> list of Entry, in timeline order; and the event ids seen.
        self.rooms = {}
        self.seen = set()
        self.sync_task = None

    # -- sync handling -------------------------------------------------------

    async def on_sync(self, response):
        if not isinstance(response, SyncResponse):
            return
        for room_id, info in response.rooms.join.items():
            for event in info.timeline.events:
                self.record(room_id, event)
        await self.retry_undecrypted()
        self.synced_once = True
        self.sync_count += 1

    def record(self, room_id, event):
        source = getattr(event, "source", None) or {}
        kind = source.get("type")
        event_id = getattr(event, "event_id", None) or source.get("event_id")
        sender = getattr(event, "sender", None) or source.get("sender")
        if not event_id or event_id in self.seen:
            return
        if isinstance(event, RoomMessage):
            entry = Entry(event_id, sender)
            entry.fill_from_message(event)
        elif isinstance(event, MegolmEvent):
            entry = Entry(event_id, sender)
            entry.encrypted = True
            entry.megolm = event
            entry.detail = "nio has no megolm session for it (yet)"
            log.warning(
                "cannot decrypt %s from %s in %s yet (session %s of device %s)",
                event_id,
                sender,
                room_id,
                event.session_id,
                event.device_id,
            )
        elif kind == "m.room.encrypted":
            # Encrypted but not something nio can even try to decrypt: an
            # unknown algorithm, or content nio's schema rejects (megolm
            # content without `sender_key` or `device_id`, say).
            entry = Entry(event_id, sender)
            entry.encrypted = True
            entry.detail = f"nio could not parse the encrypted event ({type(event).__name__}): {source}"
            log.warning("unusable encrypted event %s: %s", event_id, entry.detail)
        elif kind == "m.room.message" and isinstance(event, (BadEvent, UnknownBadEvent)):
            entry = Entry(event_id, sender)
            content = source.get("content", {}) or {}
            entry.content = content
            entry.body = content.get("body", "") or ""
            entry.relates_to = content.get("m.relates_to")
            entry.decrypted = bool(getattr(event, "decrypted", False))
            entry.encrypted = entry.decrypted
            entry.detail = f"nio rejected the message ({type(event).__name__})"
        else:
            return
        self.seen.add(event_id)
        self.rooms.setdefault(room_id, []).append(entry)
        log.info(
            "message %s from %s in %s: encrypted=%s decrypted=%s",
            event_id,
            sender,
            room_id,
            entry.encrypted,
            entry.decrypted,
        )

    async def retry_undecrypted(self):
        """Tries again the events whose key had not arrived, and asks the
        sender's devices for keys still missing after a while."""
        for room_id, entries in self.rooms.items():
            for entry in entries:
                if entry.megolm is None or entry.returned:
                    continue
                try:
                    event = self.client.decrypt_event(entry.megolm)
                except Exception as e:  # EncryptionError, mostly
                    log.debug("still cannot decrypt %s: %s", entry.event_id, e)
                    if not entry.key_requested and time.monotonic() - entry.seen_at > 2:
                        entry.key_requested = True
                        try:
                            await self.client.request_room_key(entry.megolm)
                            log.info("requested the room key for %s", entry.event_id)
                        except Exception as e:
                            log.info("room key request for %s failed: %s", entry.event_id, e)
                    continue
                if isinstance(event, RoomMessage):
                    entry.fill_from_message(event)
                    entry.encrypted = True
                    log.info("late decrypt of %s from %s", entry.event_id, entry.sender)
                else:
                    entry.megolm = None
                    entry.detail = f"decrypted to something that is not a message: {getattr(event, 'source', event)}"

    async def sync_loop(self):
        while True:
            try:
                await self.client.sync_forever(timeout=1000, full_state=True)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.error("sync loop failed, restarting:\n%s", traceback.format_exc())
                await asyncio.sleep(0.5)

    # -- commands ------------------------------------------------------------

    async def cmd_login(self, req):
        if not ENCRYPTION_ENABLED:
            raise RuntimeError("nio was installed without its e2e extra (vodozemac missing)")
        store = req["store_dir"]
        os.makedirs(store, exist_ok=True)
        config = AsyncClientConfig(encryption_enabled=True, store_sync_tokens=True)
        client = AsyncClient(req["homeserver"], req["user_id"], store_path=store, config=config)
        response = await client.login(req["password"], device_name=req.get("device_name", "talaria nio test"))
        if not isinstance(response, LoginResponse):
            await client.close()
            raise RuntimeError(f"login failed: {response}")
        if client.olm is None:
            raise RuntimeError("nio did not load its olm machine after login (store path?)")
        self.client = client
        client.add_response_callback(self.on_sync, SyncResponse)
        self.sync_task = asyncio.ensure_future(self.sync_loop())
        deadline = time.monotonic() + 60
        # Ready once a sync went through and the device's keys are on the
        # server: only then can others encrypt for this device.
        while not (self.synced_once and not client.should_upload_keys and client.olm.account.shared):
            if time.monotonic() > deadline:
                raise RuntimeError("no first sync with uploaded keys within 60 s")
            await asyncio.sleep(0.05)
        log.info("logged in as %s, device %s", client.user_id, client.device_id)
        return {"device_id": client.device_id, "user_id": client.user_id}

    async def wait_room(self, room_id, encrypted=None):
        deadline = time.monotonic() + ROOM_TIMEOUT_SECONDS
        while True:
            room = self.client.rooms.get(room_id)
            if room is not None and (encrypted is None or room.encrypted == encrypted):
                return room
            if time.monotonic() > deadline:
                state = "not synced" if room is None else f"encrypted={room.encrypted}"
                raise RuntimeError(f"room {room_id} not in nio's rooms as expected within {ROOM_TIMEOUT_SECONDS} s ({state})")
            await asyncio.sleep(0.05)

    async def cmd_create_room(self, req):
        is_direct = bool(req.get("is_direct"))
        response = await self.client.room_create(
            is_direct=is_direct,
            preset=RoomPreset.trusted_private_chat if is_direct else RoomPreset.private_chat,
            invite=list(req.get("invite", [])),
            initial_state=[
                {
                    "type": "m.room.encryption",
                    "state_key": "",
                    "content": {"algorithm": "m.megolm.v1.aes-sha2"},
                }
            ],
        )
        if isinstance(response, RoomCreateError):
            raise RuntimeError(f"createRoom failed: {response}")
        await self.wait_room(response.room_id, encrypted=True)
        return {"room_id": response.room_id}

    async def cmd_join(self, req):
        response = await self.client.join(req["room"])
        if isinstance(response, JoinError):
            raise RuntimeError(f"join failed: {response}")
        await self.wait_room(req["room"])
        return {}

    async def ready_to_send(self, room_id):
        """The room, once nio is ready to encrypt for all its members."""
        room = await self.wait_room(room_id)
        if room.encrypted:
            # The members as the server has them now (nio's view may lag
            # behind a join), then a fresh key query for all of them: a
            # device that appeared since the last query gets the session.
            members = await self.client.joined_members(room_id)
            if isinstance(members, JoinedMembersError):
                raise RuntimeError(f"joined_members failed: {members}")
            self.client.olm.users_for_key_query.update(room.users.keys())
            if self.client.should_query_keys:
                await self.client.keys_query()
        return room

    async def send_message(self, room_id, content):
        room = await self.ready_to_send(room_id)
        response = await self.client.room_send(
            room_id,
            "m.room.message",
            content,
            ignore_unverified_devices=True,
        )
        if not isinstance(response, RoomSendResponse):
            raise RuntimeError(f"send failed: {response}")
        return {"event_id": response.event_id, "encrypted": room.encrypted}

    async def cmd_send_text(self, req):
        return await self.send_message(req["room"], {"msgtype": "m.text", "body": req["body"]})

    async def cmd_send_file(self, req):
        """Uploads the file and sends it as a message of `msgtype`: in an
        encrypted room encrypted (AES-CTR, the keys in the message's `file`
        object, no top-level `url`), as Matrix clients do; in a plaintext
        room as it is, under a top-level `url`."""
        room_id = req["room"]
        room = await self.wait_room(room_id)
        data = base64.b64decode(req["data"])
        name, mime = req["name"], req["mimetype"]
        upload, keys = await self.client.upload(
            io.BytesIO(data),
            content_type=mime,
            filename=name,
            encrypt=room.encrypted,
            filesize=len(data),
        )
        if not isinstance(upload, UploadResponse):
            raise RuntimeError(f"upload failed: {upload}")
        content = {
            "msgtype": req["msgtype"],
            "body": name,
            "filename": name,
            "info": {"mimetype": mime, "size": len(data)},
        }
        if room.encrypted:
            content["file"] = {"url": upload.content_uri, **keys}
        else:
            content["url"] = upload.content_uri
        log.info("uploaded %s (%d bytes, encrypted=%s) as %s", name, len(data), room.encrypted, upload.content_uri)
        answer = await self.send_message(room_id, content)
        answer["mxc"] = upload.content_uri
        return answer

    async def fetch_file(self, entry):
        """Downloads the file a message carries, decrypting it when it came
        as a `file` object; a failure leaves `file` empty and says why in
        `detail`."""
        content = entry.content if isinstance(entry.content, dict) else {}
        encrypted_file = content.get("file")
        if isinstance(encrypted_file, dict):
            entry.file_encrypted = True
            url = encrypted_file.get("url")
        elif isinstance(content.get("url"), str):
            url = content["url"]
        else:
            return
        problem = None
        try:
            if not isinstance(url, str) or not url.startswith("mxc://"):
                raise RuntimeError(f"not an mxc:// url: {url!r}")
            response = await asyncio.wait_for(self.client.download(mxc=url), DOWNLOAD_TIMEOUT_SECONDS)
            if isinstance(response, DownloadError) or not isinstance(getattr(response, "body", None), bytes):
                raise RuntimeError(f"download of {url} failed: {response}")
            data = response.body
            if encrypted_file is None:
                entry.file = data
            else:
                key, iv = encrypted_file.get("key") or {}, encrypted_file.get("iv")
                sha256 = (encrypted_file.get("hashes") or {}).get("sha256")
                if not isinstance(key, dict) or not key.get("k") or not iv or not sha256:
                    raise RuntimeError(f"the file object lacks key.k, iv or hashes.sha256: {encrypted_file}")
                # decrypt_attachment checks the ciphertext's SHA-256 first.
                entry.file = decrypt_attachment(data, key["k"], sha256, iv)
                # What the spec asks of the object besides what decryption used.
                deviations = []
                if encrypted_file.get("v") != "v2":
                    deviations.append(f"v is {encrypted_file.get('v')!r}, not 'v2'")
                if key.get("alg") != "A256CTR" or key.get("kty") != "oct":
                    deviations.append(f"key is {key.get('kty')!r}/{key.get('alg')!r}, not 'oct'/'A256CTR'")
                if "url" in content:
                    deviations.append("a top-level url beside the encrypted file object")
                if deviations:
                    problem = "decrypted the file, but " + "; ".join(deviations)
        except asyncio.TimeoutError:
            problem = f"download of {url} took more than {DOWNLOAD_TIMEOUT_SECONDS} s"
        except Exception as e:
            problem = f"file not fetched: {type(e).__name__}: {e}"
        if problem:
            entry.detail = f"{entry.detail}; {problem}" if entry.detail else problem
            log.warning("file of %s: %s", entry.event_id, problem)
        else:
            log.info("file of %s: %d bytes (encrypted=%s)", entry.event_id, len(entry.file), entry.file_encrypted)

    async def cmd_next_message(self, req):
        room_id, sender = req["room"], req["sender"]
        deadline = time.monotonic() + req["timeout_ms"] / 1000.0
        while True:
            entry = next(
                (e for e in self.rooms.get(room_id, []) if e.sender == sender and not e.returned),
                None,
            )
            now = time.monotonic()
            if entry is not None:
                waiting_for_key = entry.megolm is not None and now < min(deadline, entry.seen_at + KEY_GRACE_SECONDS)
                if not waiting_for_key:
                    entry.returned = True
                    await self.fetch_file(entry)
                    return {"message": entry.as_json()}
            if now > deadline:
                seen = [
                    {"sender": e.sender, "event_id": e.event_id, "returned": e.returned, "decrypted": e.decrypted}
                    for e in self.rooms.get(room_id, [])
                ]
                known = room_id in self.client.rooms
                return {"message": None, "syncs": self.sync_count, "room_known": known, "seen": seen}
            await asyncio.sleep(0.05)

    async def cmd_wait_joined(self, req):
        room_id, user = req["room"], req["user"]
        deadline = time.monotonic() + req["timeout_ms"] / 1000.0
        while True:
            room = self.client.rooms.get(room_id)
            if room is not None and user in room.users and user not in room.invited_users:
                return {"joined": True}
            if time.monotonic() > deadline:
                members = sorted(room.users) if room is not None else None
                return {"joined": False, "members": members}
            await asyncio.sleep(0.05)

    async def handle(self, req):
        rid = req.get("id")
        try:
            cmd = req["cmd"]
            if cmd != "login" and self.client is None:
                raise RuntimeError("not logged in")
            method = getattr(self, f"cmd_{cmd}", None)
            if method is None:
                raise RuntimeError(f"unknown command {cmd!r}")
            result = await method(req)
            answer = {"id": rid, "ok": True, **result}
        except Exception as e:
            log.error("command %s failed:\n%s", req, traceback.format_exc())
            answer = {"id": rid, "ok": False, "error": f"{type(e).__name__}: {e}"}
        _ANSWERS.write(json.dumps(answer) + "\n")
        _ANSWERS.flush()

    async def shutdown(self):
        if self.sync_task is not None:
            self.sync_task.cancel()
        if self.client is not None:
            await self.client.close()


async def main():
    threading.Thread(target=watch_parent, daemon=True).start()
    harness = Harness()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks = set()
    while True:
        line = await reader.readline()
        if not line:
            break
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
        except ValueError:
            log.error("not JSON: %r", line)
            continue
        if req.get("cmd") == "quit":
            break
        task = asyncio.ensure_future(harness.handle(req))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await harness.shutdown()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    finally:
        os._exit(0)
