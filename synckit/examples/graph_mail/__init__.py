"""A Microsoft Graph mail example: a connector to copy (``connector``), its application
(``app``: ``synckit worker --app synckit.examples.graph_mail.app:app``), and a simulated Graph
service to run it against offline (``simulator``). ``synckit demo`` runs all three.

The App object is not re-exported here, so that ``synckit.examples.graph_mail.app`` stays the
module; ``make_app()`` builds one.
"""

from synckit.examples.graph_mail.app import (
    SEND_KIND,
    SendMailJob,
    connect_tenant,
    enqueue_send,
    make_app,
)
from synckit.examples.graph_mail.connector import (
    GRAPH_SCOPE,
    MESSAGES,
    GraphMail,
    GraphMailConfig,
    Message,
    OutgoingMail,
    internet_message_id,
)
from synckit.examples.graph_mail.simulator import GraphSimulator

__all__ = [
    "GRAPH_SCOPE",
    "MESSAGES",
    "SEND_KIND",
    "GraphMail",
    "GraphMailConfig",
    "GraphSimulator",
    "Message",
    "OutgoingMail",
    "SendMailJob",
    "connect_tenant",
    "enqueue_send",
    "internet_message_id",
    "make_app",
]
