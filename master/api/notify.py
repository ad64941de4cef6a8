"""REST views of notification subscriptions (docs/notifications.md): anyone signed in may subscribe;
people see and change their own subscriptions, staff everyone's."""

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from common.errors import NotFound
from master.api.serializers import _storable
from master.api.views import _Base, _id
from master.notify import services
from master.notify.models import EVENTS, FORMATS, Delivery, Subscription

FIELDS = ["id", "url", "email", "events", "label", "owner", "format", "created_on"]


class SubscriptionSerializer(serializers.ModelSerializer):
    events = serializers.ListField(child=serializers.ChoiceField(choices=list(EVENTS)), read_only=True)

    class Meta:
        model = Subscription
        fields = FIELDS
        read_only_fields = FIELDS


class CreatedSubscriptionSerializer(SubscriptionSerializer):
    secret = serializers.CharField(read_only=True, help_text="The signing secret, shown this once only.")

    class Meta(SubscriptionSerializer.Meta):
        fields = [*FIELDS, "secret"]
        read_only_fields = fields


class SubscriptionCreateSerializer(serializers.Serializer):
    url = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    email = serializers.CharField(max_length=254, required=False, allow_blank=True, default="")
    events = serializers.ListField(child=serializers.ChoiceField(choices=list(EVENTS)), min_length=1, max_length=16)
    label = serializers.CharField(  # type: ignore[assignment]  # the field named `label`, not its title
        max_length=255, required=False, allow_blank=True, default=""
    )
    owner = serializers.CharField(max_length=150, required=False, allow_blank=True, default="")
    format = serializers.ChoiceField(choices=list(FORMATS), required=False, default="json")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        for key in ("url", "email", "label", "owner"):
            attrs[key] = _storable(attrs[key])
        return attrs


class DeliverySerializer(serializers.ModelSerializer):
    delivery = serializers.UUIDField(source="uuid", read_only=True)
    event = serializers.CharField(source="event.kind", read_only=True)
    event_id = serializers.IntegerField(source="event.id", read_only=True)

    class Meta:
        model = Delivery
        fields = [
            "id",
            "delivery",
            "event",
            "event_id",
            "status",
            "attempts",
            "created_on",
            "next_attempt_on",
            "finished_on",
            "response_status",
            "response_body",
            "error",
        ]
        read_only_fields = fields


@extend_schema(tags=["notifications"])
class SubscriptionViewSet(mixins.ListModelMixin, _Base):
    """Notification subscriptions: a webhook or an email address for some events."""

    serializer_class = SubscriptionSerializer
    permission_classes = [IsAuthenticated]
    ordering_fields = ["id", "created_on"]

    def get_queryset(self) -> QuerySet:
        subs = Subscription.objects.order_by("id")
        user = self.request.user
        return subs if user.is_staff else subs.filter(created_by_id=user.pk)

    def _mine(self, pk: str) -> Subscription:
        sub = self.get_queryset().filter(id=_id(pk, "subscription")).first()
        if sub is None:
            raise NotFound(f"unknown subscription {pk}", field="id")
        return sub

    @extend_schema(request=SubscriptionCreateSerializer, responses={201: CreatedSubscriptionSerializer})
    def create(self, request: Request) -> Response:
        """Subscribes a webhook URL or an email address; the answer holds the signing secret, once."""
        serializer = SubscriptionCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        sub = services.add_subscription(services.NewSubscription(**serializer.validated_data), acting_user=request.user)
        return Response(CreatedSubscriptionSerializer(sub).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: OpenApiResponse(description="Removed.")})
    def destroy(self, request: Request, pk: str) -> Response:
        services.remove_subscription(self._mine(pk).id, acting_user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={202: DeliverySerializer})
    @action(detail=True, methods=["post"])
    def test(self, request: Request, pk: str) -> Response:
        """Queues a test notification to this subscription; answers with its delivery, still pending."""
        delivery = services.test_subscription(self._mine(pk).id, acting_user=request.user)
        return Response(DeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: DeliverySerializer(many=True)})
    @action(detail=True, methods=["get"])
    def deliveries(self, request: Request, pk: str) -> Response:
        """The subscription's deliveries, newest first (at most 100): status, attempts, last error."""
        sub = self._mine(pk)
        rows = Delivery.objects.filter(subscription=sub).select_related("event").order_by("-id")[:100]
        return Response(DeliverySerializer(rows, many=True).data)
