"""Builds DynamoDB update and condition expressions with placeholders for every name and value (reserved-word safe)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# One DynamoDB attribute value in the low-level client's wire shape, e.g. {"S": "x"} or {"N": "1"}.
AttributeValue = Mapping[str, Any]
# One item: attribute name -> attribute value.
Item = Mapping[str, AttributeValue]


class Expression:
    """One request's update and condition expressions plus the placeholder maps they share."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}
        self._values: dict[str, AttributeValue] = {}
        self._set: list[str] = []
        self._remove: list[str] = []
        self._add: list[str] = []
        self._conditions: list[str] = []

    # ------------------------------------------------------------ placeholders
    def name(self, attribute: str) -> str:
        """The `#n` placeholder of an attribute name (one per distinct name)."""
        placeholder = self._names.get(attribute)
        if placeholder is None:
            placeholder = f"#n{len(self._names)}"
            self._names[attribute] = placeholder
        return placeholder

    def value(self, value: AttributeValue) -> str:
        """A fresh `:v` placeholder holding `value`."""
        placeholder = f":v{len(self._values)}"
        self._values[placeholder] = value
        return placeholder

    # ------------------------------------------------------------ updates
    def set(self, attribute: str, value: AttributeValue) -> Expression:
        """SET attribute = value."""
        self._set.append(f"{self.name(attribute)} = {self.value(value)}")
        return self

    def remove(self, attribute: str) -> Expression:
        """REMOVE attribute."""
        self._remove.append(self.name(attribute))
        return self

    def add(self, attribute: str, amount: int) -> Expression:
        """ADD amount to a number attribute (created at `amount` when absent)."""
        self._add.append(f"{self.name(attribute)} {self.value({'N': str(amount)})}")
        return self

    # ------------------------------------------------------------ conditions
    def require_equal(self, attribute: str, value: AttributeValue) -> Expression:
        """Condition: attribute = value."""
        self._conditions.append(f"{self.name(attribute)} = {self.value(value)}")
        return self

    def require(self, clause: str) -> Expression:
        """Condition: a clause written with this expression's own placeholders (`name()`, `value()`)."""
        self._conditions.append(clause)
        return self

    def require_absent(self, attribute: str) -> Expression:
        """Condition: the attribute does not exist."""
        self._conditions.append(f"attribute_not_exists({self.name(attribute)})")
        return self

    def require_present(self, attribute: str) -> Expression:
        """Condition: the attribute exists."""
        self._conditions.append(f"attribute_exists({self.name(attribute)})")
        return self

    def require_string(self, attribute: str, value: str | None) -> Expression:
        """Condition: the string attribute equals `value`, or is absent when `value` is None."""
        if value is None:
            return self.require_absent(attribute)
        return self.require_equal(attribute, {"S": value})

    def require_absent_or_equal(self, attribute: str, value: AttributeValue) -> Expression:
        """Condition: the attribute is absent or equals value."""
        name = self.name(attribute)
        self._conditions.append(f"(attribute_not_exists({name}) OR {name} = {self.value(value)})")
        return self

    def require_present_and_not_equal(self, attribute: str, value: AttributeValue) -> Expression:
        """Condition: the attribute exists and differs from value."""
        name = self.name(attribute)
        self._conditions.append(f"(attribute_exists({name}) AND {name} <> {self.value(value)})")
        return self

    # ------------------------------------------------------------ request parameters
    def update_expression(self) -> str:
        """The UpdateExpression (SET, REMOVE and ADD clauses); empty when nothing is updated."""
        clauses = []
        if self._set:
            clauses.append("SET " + ", ".join(self._set))
        if self._remove:
            clauses.append("REMOVE " + ", ".join(self._remove))
        if self._add:
            clauses.append("ADD " + ", ".join(self._add))
        return " ".join(clauses)

    def condition_expression(self) -> str:
        """The conditions joined with AND; empty when there are none."""
        return " AND ".join(self._conditions)

    def params(self, update: bool = True) -> dict[str, Any]:
        """Request parameters: the expressions that are set plus the placeholder maps."""
        params: dict[str, Any] = {}
        if update and self.update_expression():
            params["UpdateExpression"] = self.update_expression()
        if self._conditions:
            params["ConditionExpression"] = self.condition_expression()
        if self._names:
            params["ExpressionAttributeNames"] = {placeholder: name for name, placeholder in self._names.items()}
        if self._values:
            params["ExpressionAttributeValues"] = dict(self._values)
        return params
