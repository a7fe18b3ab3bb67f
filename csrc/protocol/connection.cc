#include "protocol/connection.h"

#include "common/error.h"

namespace rdmaxfer {

Connection::Connection(std::shared_ptr<Channel> channel)
    : channel_(std::move(channel)),
      protocol_(std::dynamic_pointer_cast<MessageProtocol>(channel_->events())) {
  if (!protocol_) {
    throw Error(ErrorKind::kInvalidArgument,
                "the channel to " + channel_->peer() + " carries no message protocol");
  }
}

std::vector<std::pair<std::string, uint64_t>> Connection::attributes() const {
  std::vector<std::pair<std::string, uint64_t>> all = channel_->attributes();
  for (auto& entry : protocol_->attributes()) all.push_back(std::move(entry));
  return all;
}

std::shared_ptr<ChannelEvents> make_message_protocol(
    const std::shared_ptr<Channel>& channel,
    const std::shared_ptr<NotificationQueue>& notifications, uint64_t max_message_bytes) {
  auto protocol = std::make_shared<MessageProtocol>(notifications, max_message_bytes);
  protocol->bind(channel);
  return protocol;
}

}  // namespace rdmaxfer
