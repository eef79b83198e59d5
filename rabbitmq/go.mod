module github.com/idemkit/idem/rabbitmq

go 1.26.0

require (
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
	github.com/rabbitmq/amqp091-go v1.16.0
)

replace github.com/idemkit/idem => ../
