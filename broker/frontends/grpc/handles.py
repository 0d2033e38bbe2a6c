"""Handles the gRPC endpoint gives its clients, signed so that a client cannot make one up: the
receipt handle of a received message (AckMessage, ChangeInvisibleDuration,
ForwardMessageToDeadLetterQueue take it back) and the recall handle of a delayed message
(RecallMessage takes it back).

A handle is its plain text (what the endpoint needs back: which group, queue, offset, epoch;
which stored message), then ``.``, then a MAC: HMAC-SHA256, cut to 128 bits, in unpadded
base64url, over the handle's kind, the names it is bound to (a receipt's topic and consumer
group; a recall's topic) and the text. The key is derived from the cluster credential
(``protocol.cluster_key``), which every node of every group has: a handle one node issued is
verified by any other, a new leader's or another group's (a client moves to another address of
its endpoints when one fails). A handle whose MAC does not check is refused by name, before
anything is asked of the broker: forged, altered, bound to another topic or group, or issued
under another credential. The state machine still judges a genuine one (a receipt's epoch must
be its offset's current one; a recall's timer must still be pending).

Pure: no sockets, no clock.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from broker.frontends.grpc.codec import GatewayError

__all__ = ["HANDLE_CHARS_MAX", "HandleSigner", "RecallTarget"]

KEY_CONTEXT = b"dledger-grpc-handles-v1"
MAC_BYTES = 16
HANDLE_CHARS_MAX = 1024  # longer is refused unread
RECEIPT, RECALL = "receipt", "recall"
RECALL_VERSION = 1


@dataclass(frozen=True, slots=True)
class RecallTarget:
    """What a recall handle names: the delayed message a group stored (its message id, where
    its schedule copy is in the commitlog) and when it is due."""

    group: str
    topic: str
    message_id: str
    position: int
    slot: int
    due_ms: int


class HandleSigner:
    def __init__(self, cluster_key: bytes) -> None:
        if not cluster_key:
            raise ValueError("handles are signed with the cluster credential: none given")
        self._key = hmac.new(cluster_key, KEY_CONTEXT, hashlib.sha256).digest()

    def _mac(self, kind: str, bound: tuple[str, ...], text: str) -> str:
        signed = "\n".join((kind, *bound, text)).encode("utf-8", "surrogatepass")
        digest = hmac.new(self._key, signed, hashlib.sha256).digest()[:MAC_BYTES]
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def _sign(self, kind: str, bound: tuple[str, ...], text: str) -> str:
        return f"{text}.{self._mac(kind, bound, text)}"

    def _open(self, kind: str, bound: tuple[str, ...], handle: str, code: int) -> str:
        """The text of a handle whose MAC checks; else GatewayError(``code``) saying so."""
        if not isinstance(handle, str) or not handle or len(handle) > HANDLE_CHARS_MAX:
            raise GatewayError(code, f"not a {kind} handle (empty, or over "
                                     f"{HANDLE_CHARS_MAX} characters)")
        text, dot, mac = handle.rpartition(".")
        if not dot or not text:
            raise GatewayError(code, f"not a {kind} handle this endpoint issued (unsigned): "
                                     f"{handle[:80]!r}")
        # (bytes compared: compare_digest refuses text that is not ASCII with a TypeError)
        if not hmac.compare_digest(mac.encode("utf-8", "surrogatepass"),
                                   self._mac(kind, bound, text).encode()):
            raise GatewayError(code, f"a forged or altered {kind} handle (its signature does not "
                                     f"check for {'/'.join(bound)}): {handle[:80]!r}")
        return text

    # -- receipt handles (pop consumption) -----------------------------------------------------

    def sign_receipt(self, text: str, topic: str, consumer_group: str) -> str:
        """A receipt handle for ``text``, good only with this topic and consumer group."""
        return self._sign(RECEIPT, (topic, consumer_group), text)

    def open_receipt(self, handle: str, topic: str, consumer_group: str) -> str:
        """The text of a receipt handle issued for this topic and consumer group; else
        INVALID_RECEIPT_HANDLE naming why."""
        return self._open(RECEIPT, (topic, consumer_group), handle,
                          pb.Code.INVALID_RECEIPT_HANDLE)

    # -- recall handles (delayed messages) -----------------------------------------------------

    def sign_recall(self, t: RecallTarget) -> str:
        fields = [RECALL_VERSION, t.group, t.topic, t.message_id, t.position, t.slot, t.due_ms]
        text = base64.urlsafe_b64encode(json.dumps(fields, separators=(",", ":")).encode())
        return self._sign(RECALL, (t.topic,), text.rstrip(b"=").decode())

    def open_recall(self, handle: str, topic: str) -> RecallTarget:
        """What a recall handle issued for ``topic`` names; else BAD_REQUEST naming why."""
        text = self._open(RECALL, (topic,), handle, pb.Code.BAD_REQUEST)
        try:
            fields: Any = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        except (ValueError, binascii.Error) as err:  # (signed by us: only a key shared with
            raise GatewayError(pb.Code.BAD_REQUEST,  # an older, other format could get here)
                               f"a recall handle of an unknown form: {err}") from err
        if not (isinstance(fields, list) and len(fields) == 7 and fields[0] == RECALL_VERSION
                and all(isinstance(v, str) for v in fields[1:4])
                and all(type(v) is int and v >= 0 for v in fields[4:])):
            raise GatewayError(pb.Code.BAD_REQUEST, "a recall handle of an unknown version")
        _, group, topic_, message_id, position, slot, due_ms = fields
        return RecallTarget(group, topic_, message_id, position, slot, due_ms)
