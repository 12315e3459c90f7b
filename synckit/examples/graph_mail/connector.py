"""A Microsoft Graph mail connector: the one to copy when you write your own.

Read it top to bottom; each part teaches one thing synckit expects of a connector:

1. **Config** (:class:`GraphMailConfig`): what each tenant provides, as a pydantic model.
   It is validated when the tenant is added; secrets are ``SecretStr``.
2. **Auth** (``GraphMail.auth``): OAuth2 against Azure AD, whose refresh tokens rotate,
   declared with :class:`~synckit.connectors.auth.OAuth2`. The runtime fulfils it
   (:class:`~synckit.runtime.credentials.oauth.OAuth2Auth`): it keeps the tokens encrypted in the
   database, refreshes them once across every worker, and marks the tenant
   ``needs_reauth`` when Azure AD refuses (``invalid_grant``).
3. **Reading** (:meth:`GraphMail.poll`): delta sync of one mail folder. Pages follow
   ``@odata.nextLink``; the checkpoint stored after each page is the link to the next one,
   and after the last page the ``@odata.deltaLink``, so the next cycle asks only for what
   changed. A dead delta token (410 Gone) starts a full resync.
4. **Records** (``MESSAGES``): records as data. The stream declares what a message
   becomes, a row of ``mail_messages`` (the :class:`Message` model's fields, keyed by
   ``id``), and synckit does the rest: ``synckit db upgrade --app`` creates the table,
   every page is validated and merged in the page's own transaction with its checkpoint
   (a malformed message fails alone and waits in the dead-letter queue for review; the
   others land), ``@removed`` marks a row deleted, and the last page of a full sync
   sweeps the rows it did not see. The connector has no ``handle()``, no SQL, no
   table. The app reads what changed with ``app.records(tenant, "messages").changes()``.
5. **Writing** (:meth:`GraphMail.send_mail`): ``sendMail`` answers ``202`` with no id and
   is not idempotent. The send runs as an *intent*: we stamp the message with our own
   ``internetMessageId``, and a retry whose earlier attempt lost its answer first looks
   for that id in Sent Items. (:mod:`synckit.examples.graph_mail.app` runs sends as jobs.)
6. **Change notifications** (``GraphMail.webhooks``): Graph pushes "something changed in
   this folder" to ``synckit web``'s ``/webhooks/graph_mail/<tenant>`` while a
   subscription lives; each notification carries the tenant's ``client_state`` (a secret
   of its sealed config, checked on every notification) and triggers a delta cycle of
   ``messages`` at once, instead of at the next scheduled poll. Subscriptions expire
   within 4230 minutes: synckit creates one per tenant (the hooks
   :meth:`GraphMail.create_subscription`, :meth:`GraphMail.renew_subscription`,
   :meth:`GraphMail.delete_subscription`), renews it before it expires, recreates it
   when Graph forgot it, and, if it lapses, the poll schedule (which never stops) carries
   on alone. Set ``App(webhook_url=...)`` (or ``$SYNCKIT_WEBHOOK_URL``) to where Graph
   reaches ``synckit web``'s ``/webhooks``.

Nothing here retries, sleeps, or checks a status code: ``ctx.http`` raises the exception
that tells the runtime what to do (wait out a 429's ``Retry-After``, back off on a 503,
refresh on a 401), and the runtime does it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, SecretStr

from synckit import (
    Connector,
    GraphNotifications,
    NextUrlPaginator,
    OAuth2,
    OAuth2Config,
    Page,
    ProviderSubscription,
    RateLimit,
    Records,
    Stream,
    Subscription,
    SubscriptionRequest,
    SyncContext,
    Webhooks,
)
from synckit.connectors.intents import IntentResult, RemoteRecord
from synckit.errors import ErrorClass
from synckit.errors.exceptions import PermanentError

__all__ = [
    "GRAPH_SCOPE",
    "MESSAGES",
    "GraphMail",
    "GraphMailConfig",
    "Message",
    "OutgoingMail",
    "internet_message_id",
]

#: ``.default`` asks for the permissions the app was granted; ``offline_access`` for a
#: refresh token.
GRAPH_SCOPE = "https://graph.microsoft.com/.default offline_access"
#: The right-hand side of the ``internetMessageId`` we stamp on sent mail (use yours).
MESSAGE_ID_DOMAIN = "synckit.example"


# --- 1. config ---------------------------------------------------------------------------


class GraphMailConfig(BaseModel):
    """One tenant's connection: its Azure AD app registration and the folder to sync."""

    model_config = ConfigDict(extra="forbid")

    #: The Azure AD tenant (directory) id or domain.
    tenant_id: str
    client_id: str
    client_secret: SecretStr
    #: A well-known folder name (``inbox``, ``archive``, ...) or a folder id.
    folder: str = "inbox"
    graph_url: str = "https://graph.microsoft.com/v1.0"
    #: Default: Azure AD's token endpoint for ``tenant_id``.
    token_url: str | None = None
    #: Messages per delta page (Graph's ``Prefer: odata.maxpagesize``).
    page_size: int = Field(default=50, ge=1, le=1000)
    #: The ``clientState`` of the tenant's change-notification subscription: a secret
    #: Graph echoes in every notification (without it, no subscription is made).
    client_state: SecretStr | None = None

    @property
    def token_endpoint(self) -> str:
        return (
            self.token_url
            or f"https://login.microsoftonline.com/{self.tenant_id}/oauth2/v2.0/token"
        )


# --- what we keep of a message, and where -------------------------------------------------


class Message(BaseModel):
    """A row of ``mail_messages``: the fields this connector keeps (Graph sends many
    more; they are ignored). Aliases are Graph's names.

    Validating up front is what turns a message that breaks the contract into one
    clear dead letter ("receivedDateTime: Input should be a valid datetime") instead of
    a ``KeyError`` three functions later, or worse, a row of garbage.
    """

    id: str
    subject: str
    received_at: AwareDatetime = Field(alias="receivedDateTime")
    sender: str
    internet_message_id: str = Field(alias="internetMessageId")
    is_read: bool = Field(default=False, alias="isRead")


def message_row(record: Any) -> Any:
    """Graph's message JSON as :class:`Message`'s input: the sender's address lifted out
    of ``from.emailAddress`` (anything else is left for the model to judge)."""
    if not isinstance(record, dict):
        return record
    sender = record.get("from")
    address = sender.get("emailAddress") if isinstance(sender, dict) else None
    if isinstance(address, dict) and "address" in address:
        return {**record, "sender": address["address"]}
    return record


#: Where a tenant's messages land: one row per message id, Graph's ``@removed`` marks a
#: row deleted, and a completed full sync deletes the rows it did not see.
MESSAGES = Records(
    Message,
    table="mail_messages",
    key="id",
    map=message_row,
    deleted=lambda record: isinstance(record, dict) and "@removed" in record,
    sweep=True,
)


# --- writing: what a send looks like --------------------------------------------------------


class OutgoingMail(BaseModel):
    """A message to send."""

    model_config = ConfigDict(extra="forbid")

    to: list[str] = Field(min_length=1)
    subject: str
    body: str


def internet_message_id(tenant: str, key: str) -> str:
    """The ``internetMessageId`` of the send named ``key``: the same on every attempt."""
    return f"<{uuid.uuid5(uuid.NAMESPACE_URL, f'synckit:{tenant}:{key}')}@{MESSAGE_ID_DOMAIN}>"


# --- the connector ---------------------------------------------------------------------------


class GraphMail(Connector[GraphMailConfig]):
    """Syncs one mail folder per tenant from Microsoft Graph, and sends mail."""

    name = "graph_mail"
    streams = (Stream("messages", records=MESSAGES),)
    # Graph allows 4 concurrent requests per mailbox, and about 10,000 per 10 minutes.
    max_in_flight = 4
    rate_limit = RateLimit(per_second=15, burst=30)
    # Delta pages: messages at "value", the next page's URL at "@odata.nextLink".
    paginator = NextUrlPaginator(records="value", next="@odata.nextLink")
    # Change notifications: each verified notification triggers a cycle of "messages"
    # (at most one per Stream.webhook_window). Graph lets a subscription to messages
    # live 4230 minutes at most; asking for 4200 leaves room for clock skew (a request
    # past the limit is refused). It is renewed at 2/3 of that, or 6 hours before expiry.
    webhooks = Webhooks(
        verify=GraphNotifications(secret_field="client_state"),
        subscription=Subscription(lifetime=timedelta(minutes=4200)),
    )

    # --- 2. auth ------------------------------------------------------------------------

    # A declaration, fulfilled by the runtime: the tokens themselves are not in the
    # config; they were stored for the tenant when its admin consented (see
    # synckit.examples.graph_mail.app.connect_tenant), and the runtime attaches, refreshes
    # and stores them. The OAuth2Config is built per tenant, from its config.
    auth = OAuth2(
        lambda graph: OAuth2Config(
            token_url=graph.config.token_endpoint,
            client_id=graph.config.client_id,
            client_secret=graph.config.client_secret.get_secret_value(),
            auth_method="client_secret_post",  # what Azure AD documents
            scope=GRAPH_SCOPE,
        )
    )

    # --- 3. reading -----------------------------------------------------------------------

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        """Delta pages from the stored link; the checkpoint is always the next link to call.

        The checkpoint is ``{"deltaLink": url}`` between cycles, and ``{"nextLink": url,
        "fullSyncSince": iso}`` in the middle of one: a worker that dies mid-sync resumes at
        the page it was on, not at the beginning.
        """
        stored = checkpoint or {}
        link: str | None = stored.get("nextLink") or stored.get("deltaLink")
        full_since: str | None = stored.get("fullSyncSince")
        started_over = link is None
        if link is None:
            link, full_since = self._full_sync()
        prefer = {"Prefer": f"odata.maxpagesize={self.config.page_size}"}
        while True:
            try:
                # Links are absolute and carry their own tokens: the paginator calls them
                # as given, and refuses a page without a "value" list.
                async for page in self.paginator.fetch(ctx.http, link, headers=prefer):
                    if page.next is not None:
                        checkpoint = {"nextLink": page.next, "fullSyncSince": full_since}
                    elif delta_link := page.body.get("@odata.deltaLink"):
                        checkpoint = {"deltaLink": delta_link}
                    else:
                        raise PermanentError("last delta page without an @odata.deltaLink")
                    # A full sync lists what exists; it does not report what was deleted
                    # while the delta token was dead: its last page sweeps the rows it did
                    # not see (synckit does it, in that page's transaction).
                    yield Page(
                        page.records,
                        checkpoint=checkpoint,
                        full_sync=full_since,
                        sweep=full_since is not None and page.next is None,
                    )
                break
            except PermanentError as exc:
                # Graph answers 410 Gone (SyncStateNotFound) when a delta or skip token
                # has expired; synckit classifies 410 as not_found. The only way on is a
                # full sync. A full sync begun in this cycle that fails so is a real error.
                if started_over or _error_class(exc) is not ErrorClass.NOT_FOUND:
                    raise
                ctx.log.warning("graph.delta_expired", error=str(exc)[:200])
                link, full_since = self._full_sync()
                started_over = True

    def _full_sync(self) -> tuple[str, str]:
        """The first link of a full sync, and when it started (its id, for the sweep)."""
        url = f"{self.config.graph_url}/me/mailFolders/{self.config.folder}/messages/delta"
        return url, datetime.now(UTC).isoformat()

    # --- 5. writing -----------------------------------------------------------------------

    async def send_mail(self, ctx: SyncContext, key: str, mail: OutgoingMail) -> IntentResult:
        """Send ``mail`` once per ``key``, whatever fails: lost answers, crashes, retries.

        Returns the intent's result; its ``remote_id`` is the message's
        ``internetMessageId``, and ``outcome`` says whether this call sent it
        (``created``), found it sent by an earlier attempt (``found``), or knew it was
        sent (``stored``).
        """
        message_id = internet_message_id(self.tenant, key)
        message = {
            "subject": mail.subject,
            "body": {"contentType": "text", "content": mail.body},
            "toRecipients": [{"emailAddress": {"address": a}} for a in mail.to],
            # Our handle on the message: sendMail gives us none.
            "internetMessageId": message_id,
        }

        async def create(_idempotency_key: str) -> RemoteRecord:
            # Graph takes no idempotency key: if this answer is lost, only `find` knows.
            await ctx.http.post(
                f"{self.config.graph_url}/me/sendMail",
                json={"message": message, "saveToSentItems": True},  # find looks there
            )
            return RemoteRecord(message_id)

        async def find() -> RemoteRecord | None:
            # Real Graph may take a few seconds to show a sent message in Sent Items; a
            # production connector should give an unanswered send that long before a
            # retry concludes it was not sent.
            quoted = message_id.replace("'", "''")
            response = await ctx.http.get(
                f"{self.config.graph_url}/me/mailFolders/sentitems/messages",
                params={"$filter": f"internetMessageId eq '{quoted}'", "$select": "id"},
            )
            found = response.json().get("value") or []
            return RemoteRecord(message_id, {"id": found[0]["id"]}) if found else None

        # The request is fingerprinted: the same key with another mail is refused.
        return await ctx.intent(key, create=create, find=find, request=mail.model_dump(mode="json"))

    # --- 6. change notifications ----------------------------------------------------------

    async def create_subscription(
        self, ctx: SyncContext, request: SubscriptionRequest
    ) -> ProviderSubscription:
        """Subscribe to changes of the synced folder. Graph first calls the notification
        URL with a ``validationToken`` (synckit's receiver echoes it) and only then
        answers 201; a failure is an exception like any other (synckit retries)."""
        response = await ctx.http.post(
            f"{self.config.graph_url}/subscriptions",
            json={
                "changeType": "created,updated,deleted",
                "notificationUrl": request.notification_url,
                "resource": f"me/mailFolders('{self.config.folder}')/messages",
                "expirationDateTime": _graph_time(request.expires_at),
                "clientState": request.client_state,
            },
        )
        return _subscription(response.json())

    async def renew_subscription(
        self, ctx: SyncContext, current: ProviderSubscription, expires_at: datetime
    ) -> ProviderSubscription:
        """Push the expiry back; a 404 (Graph forgot it) makes synckit create a new one."""
        response = await ctx.http.patch(
            f"{self.config.graph_url}/subscriptions/{current.id}",
            json={"expirationDateTime": _graph_time(expires_at)},
        )
        return _subscription(response.json())

    async def delete_subscription(self, ctx: SyncContext, current: ProviderSubscription) -> None:
        await ctx.http.delete(f"{self.config.graph_url}/subscriptions/{current.id}")


def _graph_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.0000000Z")


def _subscription(body: Any) -> ProviderSubscription:
    """Graph's subscription resource as synckit needs it (a malformed one is an error)."""
    try:
        expires = datetime.fromisoformat(str(body["expirationDateTime"]).replace("Z", "+00:00"))
        return ProviderSubscription(str(body["id"]), expires.astimezone(UTC))
    except (KeyError, TypeError, ValueError) as exc:
        raise PermanentError(f"malformed subscription in Graph's answer: {exc!r}") from None


def _error_class(exc: BaseException) -> ErrorClass | None:
    classification = getattr(exc, "classification", None)
    return getattr(classification, "error_class", None)
