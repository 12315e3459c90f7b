"""Change notifications of the Graph simulator: subscriptions created (after Graph's
validation handshake with the notification URL), renewed, deleted or forgotten, and the
notifications queued for them and delivered (:class:`Subscriptions`)."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx

from synckit.examples.graph_mail.graph_shapes import folder_name, graph_error, iso
from synckit.runtime.http.transports import tls_context
from synckit.testing.replies import RecordedRequest, Reply

if TYPE_CHECKING:
    from synckit.examples.graph_mail.simulator import GraphSimulator, Mailbox, _Item

__all__ = ["MAX_SUBSCRIPTION_LIFETIME", "GraphSubscription", "Subscriptions"]

#: The longest a subscription to messages may live (Graph's limit: 4230 minutes).
MAX_SUBSCRIPTION_LIFETIME = timedelta(minutes=4230)
_RESOURCE = re.compile(r"/?me/(?:mailFolders\('([^']+)'\)/)?messages", re.IGNORECASE)


@dataclass
class GraphSubscription:
    id: str
    tenant: str
    folder: str | None  # None: every folder (``me/messages``)
    resource: str
    change_types: frozenset[str]
    notification_url: str
    client_state: str | None
    expires_at: datetime


class Subscriptions:
    """The simulator's subscriptions and queued notifications (state shared with the
    simulator under its FakeAPI's lock)."""

    def __init__(self, sim: GraphSimulator) -> None:
        self.sim = sim
        self.subs: dict[str, GraphSubscription] = {}
        self.queued: list[tuple[str, dict[str, Any]]] = []  # (subscription id, notification)

    def live(self, tenant: str | None = None) -> list[dict[str, Any]]:
        """The live subscriptions (of ``tenant``), as Graph shows them."""
        with self.sim.api.lock:
            now = self.sim.clock()
            return [
                self.body(sub)
                for sub in self.subs.values()
                if (tenant in (None, sub.tenant)) and sub.expires_at > now
            ]

    def forget(self, subscription_id: str) -> None:
        """Drop a subscription as Graph sometimes does: renewing it then answers 404."""
        with self.sim.api.lock:
            self.subs.pop(subscription_id, None)

    def queued_count(self) -> int:
        with self.sim.api.lock:
            return len(self.queued)

    async def send(self) -> list[int]:
        """POST every queued notification to its subscription's URL, one delivery per
        subscription (``{"value": [...]}``); the status of each delivery (0: no answer).
        Notifications of a subscription that expired meanwhile are dropped."""
        with self.sim.api.lock:
            queued, self.queued = self.queued, []
            now = self.sim.clock()
            batches: dict[str, list[dict[str, Any]]] = {}
            urls: dict[str, str] = {}
            for sub_id, note in queued:
                sub = self.subs.get(sub_id)
                if sub is not None and sub.expires_at > now:
                    batches.setdefault(sub_id, []).append(note)
                    urls[sub_id] = sub.notification_url
        statuses: list[int] = []
        async with httpx.AsyncClient(timeout=10.0, verify=tls_context()) as client:
            for sub_id, notes in batches.items():
                try:
                    r = await client.post(urls[sub_id], json={"value": notes})
                    statuses.append(r.status_code)
                except httpx.HTTPError:
                    statuses.append(0)
                self.sim.stats.notifications[notes[0]["tenantId"]] += len(notes)
        return statuses

    def changed(self, item: _Item, change: str) -> None:
        """Queue a notification for each live subscription that covers ``item``."""
        now = self.sim.clock()
        for sub in self.subs.values():
            if (
                sub.tenant != item.tenant
                or sub.expires_at <= now
                or change not in sub.change_types
                or sub.folder not in (None, item.folder)
            ):
                continue
            resource = f"Users/{self.user_id(item.tenant)}/Messages/{item.id}"
            note: dict[str, Any] = {
                "id": self.sim.opaque("ntf"),
                "subscriptionId": sub.id,
                "subscriptionExpirationDateTime": iso(sub.expires_at),
                "changeType": change,
                "resource": resource,
                "resourceData": {
                    "@odata.type": "#Microsoft.Graph.Message",
                    "@odata.id": resource,
                    "id": item.id,
                },
                "tenantId": item.tenant,
            }
            if sub.client_state is not None:
                note["clientState"] = sub.client_state
            self.queued.append((sub.id, note))

    def user_id(self, tenant: str) -> str:
        return str(uuid.UUID(self.sim.digest(f"user:{tenant}")[:32]))

    def body(self, sub: GraphSubscription) -> dict[str, Any]:
        return {
            "@odata.context": "https://graph.microsoft.com/v1.0/$metadata#subscriptions/$entity",
            "id": sub.id,
            "resource": sub.resource,
            "changeType": ",".join(sorted(sub.change_types)),
            "clientState": sub.client_state,
            "notificationUrl": sub.notification_url,
            "expirationDateTime": sub.expires_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        }

    def expiry(self, raw: Any) -> datetime | Reply:
        """A requested ``expirationDateTime``, or the 400 Graph answers."""
        try:
            moment = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
        except ValueError:
            return graph_error(400, "InvalidRequest", "expirationDateTime is not a date.")
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        now = self.sim.clock()
        if moment <= now:
            return graph_error(400, "InvalidRequest", "expirationDateTime is in the past.")
        if moment > now + MAX_SUBSCRIPTION_LIFETIME:
            return graph_error(
                400,
                "InvalidRequest",
                "Subscription expiration can only be 4230 minutes in the future.",
            )
        return moment

    def create(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        try:
            body = request.json()
        except ValueError:
            return graph_error(400, "BadRequest", "Unable to read JSON request payload.")
        if not isinstance(body, dict):
            return graph_error(400, "BadRequest", "A subscription is a JSON object.")
        url, resource = body.get("notificationUrl"), body.get("resource")
        changes = {c.strip() for c in str(body.get("changeType") or "").split(",") if c.strip()}
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            return graph_error(400, "InvalidRequest", "notificationUrl must be an URL.")
        m = _RESOURCE.fullmatch(str(resource or ""))
        if m is None:
            return graph_error(400, "InvalidRequest", f"Unsupported resource {resource!r}.")
        folder = folder_name(m.group(1)) if m.group(1) else None
        if m.group(1) and folder is None:
            return graph_error(404, "ErrorItemNotFound", "The specified folder was not found.")
        if not changes or not changes <= {"created", "updated", "deleted"}:
            return graph_error(400, "InvalidRequest", "changeType is invalid.")
        expires = self.expiry(body.get("expirationDateTime"))
        if isinstance(expires, Reply):
            return expires
        problem = self.validate(url, mailbox.tenant)
        if problem is not None:
            return graph_error(
                400,
                "InvalidRequest",
                f"Subscription validation request failed. {problem}",
            )
        state = body.get("clientState")
        sub = GraphSubscription(
            id=str(uuid.UUID(self.sim.digest(f"sub:{self.sim.opaque('s')}")[:32])),
            tenant=mailbox.tenant,
            folder=folder,
            resource=str(resource),
            change_types=frozenset(changes),
            notification_url=url,
            client_state=str(state) if state is not None else None,
            expires_at=expires,
        )
        self.subs[sub.id] = sub
        self.sim.stats.subscriptions_created[mailbox.tenant] += 1
        return Reply.json(self.body(sub), 201)

    def validate(self, url: str, tenant: str) -> str | None:
        """Graph's validation handshake: the URL must echo the token within 10 s."""
        token = f"Validation: Testing client application reachability {self.sim.opaque('vt')}"
        self.sim.stats.validations[tenant] += 1
        try:
            with httpx.Client(timeout=10.0, verify=tls_context()) as client:
                r = client.post(
                    url, params={"validationToken": token}, headers={"Content-Type": "text/plain"}
                )
        except httpx.HTTPError as exc:
            return f"The notification URL could not be reached: {type(exc).__name__}."
        if r.status_code != 200 or r.text != token:
            return (
                "Response must exactly match validationToken query parameter "
                f"(got {r.status_code})."
            )
        return None

    def live_one(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        sub = self.subs.get(request.params["id"])
        if sub is None or sub.tenant != mailbox.tenant or sub.expires_at <= self.sim.clock():
            return graph_error(
                404, "ResourceNotFound", f"The object '{request.params['id']}' doesn't exist."
            )
        return sub

    def get(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        sub = self.live_one(mailbox, request)
        return sub if isinstance(sub, Reply) else self.body(sub)

    def renew(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        sub = self.live_one(mailbox, request)
        if isinstance(sub, Reply):
            return sub
        try:
            body = request.json()
        except ValueError:
            return graph_error(400, "BadRequest", "Unable to read JSON request payload.")
        expires = self.expiry(body.get("expirationDateTime") if isinstance(body, dict) else None)
        if isinstance(expires, Reply):
            return expires
        sub.expires_at = expires
        self.sim.stats.subscriptions_renewed[mailbox.tenant] += 1
        return self.body(sub)

    def delete(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        sub = self.live_one(mailbox, request)
        if isinstance(sub, Reply):
            return sub
        del self.subs[sub.id]
        self.sim.stats.subscriptions_deleted[mailbox.tenant] += 1
        return Reply.empty(204)
